"""A belayq consumer run as a child process by the fault-injection tests.

It counts every Redis call its main thread makes (``redis.Redis.execute_command`` and
``Pipeline.execute``, wrapped below) and sends itself SIGKILL right before or right after
call number ``--kill-at`` (``--when before|after``). Every completed call is written to a
JSON-lines log (``--log``) with its reply *before* an after-call kill, so the test knows
exactly what reached Redis: which claims were registered, which acks were applied.

Scenarios (the sequence of calls is fixed, given the queue state the test prepared):

``script``  four messages are waiting: claim 2 (claim.lua), extend both, ack the first,
            nack the second (back to ready), claim 1 (it comes back), release it, claim 3,
            ack them in one call, sweep.
``blmove``  the queue is empty: claim blocks in BLMOVE (the test publishes one message once
            it sees the block), lease.lua registers it, extend, nack, claim it again, ack.
``stall``   the queue is empty: claim (timeout 3 s) blocks in BLMOVE, and whatever it gets
            is acked; with ``--stop`` the child stops itself (SIGSTOP) right after call K
            instead of dying, so the test can let the sweep act in the BLMOVE -> lease gap
            and then resume it (SIGCONT).
``hold``    claim one message with the lease keeper running, print ``HOLDING <id> <n>`` and
            keep it (the keeper extends the lease) until killed from outside.

With ``--kill-at 0`` nothing is killed: the run ends with an ``end`` record giving the
number of calls, which bounds the kill points the tests try.

Run: python consumer_child.py --port P --queue Q --scenario script --kill-at K --when after
    --log /tmp/x.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import redis
import redis.client

from belayq import ReliableQueue
from belayq.sources import script_of


class Killer:
    """Counts the main thread's Redis calls and kills the process at call ``kill_at``."""

    def __init__(self, kill_at: int, when: str, log_path: str, stop: bool = False) -> None:
        self.kill_at = kill_at
        self.when = when
        self.stop = stop  # SIGSTOP instead of SIGKILL: stall until the test sends SIGCONT
        self.calls = 0
        self.armed = False
        self.fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(self, record: dict[str, Any]) -> None:
        # One unbuffered write per record: it is in the kernel before any SIGKILL.
        os.write(self.fd, (json.dumps(record) + "\n").encode())

    def call(self, describe: dict[str, Any], run: Any) -> Any:
        if not self.armed or threading.current_thread() is not threading.main_thread():
            return run()
        self.calls += 1
        k = self.calls
        if k == self.kill_at and self.when == "before":
            self.log({"phase": "kill", "k": k, "when": "before", "t": time.time(), **describe})
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            reply = run()
        except Exception as exc:
            self.log({"phase": "error", "k": k, "error": repr(exc), **describe})
            raise
        self.log({"phase": "done", "k": k, "reply": _plain(reply), **describe})
        if k == self.kill_at and self.when == "after":
            if self.stop:
                self.log({"phase": "stop", "k": k, "t": time.time(), **describe})
                os.kill(os.getpid(), signal.SIGSTOP)
                self.log({"phase": "cont", "k": k, "t": time.time()})
            else:
                self.log({"phase": "kill", "k": k, "when": "after", "t": time.time(), **describe})
                os.kill(os.getpid(), signal.SIGKILL)
        return reply

    def install(self) -> None:
        killer = self
        plain_execute = redis.Redis.execute_command
        pipe_execute = redis.client.Pipeline.execute

        def execute_command(self: Any, *args: Any, **options: Any) -> Any:
            return killer.call(_describe(args), lambda: plain_execute(self, *args, **options))

        def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
            stack = [_describe(c[0]) for c in getattr(self, "command_stack", [])]
            return killer.call(
                {"cmd": "PIPELINE", "commands": stack}, lambda: pipe_execute(self, *args, **kwargs)
            )

        redis.Redis.execute_command = execute_command  # type: ignore[method-assign]
        redis.client.Pipeline.execute = execute  # type: ignore[method-assign]


def _plain(value: Any) -> Any:
    """A JSON-able copy of a Redis reply (bytes as text)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return repr(value)


def _describe(args: tuple[Any, ...]) -> dict[str, Any]:
    """Command name, script name and the script-specific ARGV of an EVALSHA or FCALL."""
    cmd = str(_plain(args[0])).upper()
    out: dict[str, Any] = {"cmd": cmd}
    if cmd in ("EVALSHA", "FCALL"):
        numkeys = int(args[2])
        out["script"] = script_of(args) or "?"
        out["argv"] = _plain(list(args[3 + numkeys + 6 :]))  # after KEYS and the common six
    else:
        out["args"] = _plain(list(args[1:]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--scenario", choices=("script", "blmove", "stall", "hold"), required=True)
    ap.add_argument("--kill-at", type=int, default=0)
    ap.add_argument("--when", choices=("before", "after"), default="before")
    ap.add_argument("--lease-ms", type=int, default=600)
    ap.add_argument("--sweep-ms", type=int, default=100)
    ap.add_argument("--client-name", default="belayq-chaos-child")
    ap.add_argument("--log", required=True)
    ap.add_argument("--stop", action="store_true", help="SIGSTOP (after K) instead of SIGKILL")
    a = ap.parse_args()

    killer = Killer(a.kill_at, a.when, a.log, stop=a.stop)
    killer.install()
    client = redis.Redis(port=a.port, client_name=a.client_name)
    opts = {"lease_ms": a.lease_ms, "sweep_interval_ms": a.sweep_ms}

    if a.scenario == "hold":
        q = ReliableQueue(client, a.queue, keeper=True, **opts)
        [d] = q.claim(timeout=30)
        print(f"HOLDING {d.id} {d.deliveries}", flush=True)
        while True:
            time.sleep(1)

    q = ReliableQueue(client, a.queue, keeper=False, **opts)
    killer.log({"phase": "start", "pid": os.getpid(), "t": time.time()})
    killer.armed = True  # count from here: the claim and settle paths, not the handshake

    if a.scenario == "script":
        d0, d1 = q.claim(timeout=0, count=2)
        assert all(q.extend([d0, d1]))
        assert q.ack(d0)
        assert q.nack(d1, delay_ms=0) == "ready"
        [d1b] = q.claim(timeout=0, count=1)
        assert d1b.id == d1.id and d1b.deliveries == 2
        assert q.release([d1b]) == 1
        rest = q.claim(timeout=0, count=3)
        assert len(rest) == 3
        assert all(q.ack_many(rest))
        q.sweep()
    elif a.scenario == "stall":
        for d in q.claim(timeout=3):
            assert q.ack(d)
    else:  # blmove
        [d] = q.claim(timeout=15)
        assert all(q.extend([d]))
        assert q.nack(d, delay_ms=0) == "ready"
        [d2] = q.claim(timeout=0)
        assert d2.id == d.id and d2.deliveries == 2
        assert q.ack(d2)

    killer.armed = False
    killer.log({"phase": "end", "calls": killer.calls, "t": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
