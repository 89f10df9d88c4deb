"""Recovery after ``kill -9``: a child process claims a message and is SIGKILLed while
holding it; the time until another consumer receives it (belayq), or the proof that it
never comes back (the raw ``BLMOVE`` floor).

The child is this package run as ``python -m benchmarks.core --child ...``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from belayq import ReliableQueue

from .fixtures import RAW_P, RAW_Q, fresh, need

ROOT = Path(__file__).resolve().parents[2]
BLOCKED_START_S = 1.0


def child_main(argv: list[str]) -> None:
    """A consumer that claims one message, says so on stdout, and waits to be killed."""
    kind, port = argv[0], int(argv[1])
    r = redis.Redis(host="127.0.0.1", port=port)
    if kind == "belayq":
        name, lease_ms = argv[2], int(argv[3])
        q = ReliableQueue(r, name, lease_ms=lease_ms)
        got = q.claim(timeout=30)
        if not got:
            sys.exit(3)
        print(json.dumps({"id": got[0].id, "t": time.monotonic()}), flush=True)
    else:
        src, dst = argv[2], argv[3]
        v = r.blmove(src, dst, 30, "RIGHT", "LEFT")
        if v is None:
            sys.exit(3)
        print(json.dumps({"entry": v.decode(), "t": time.monotonic()}), flush=True)
    while True:
        time.sleep(3600)


def _spawn_child(args: list[str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.core", "--child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 30)
    line = child.stdout.readline() if ready else ""
    if not line:
        child.kill()
        child.wait()
        raise RuntimeError(f"crash child {args} did not report a claim")
    return child, json.loads(line)


def _kill(child: subprocess.Popen[str]) -> float:
    os.kill(child.pid, signal.SIGKILL)
    t = time.monotonic()
    child.wait()
    return t


def _server_ms(r: redis.Redis) -> float:
    s, us = r.time()
    return s * 1000 + us / 1000


@dataclass(kw_only=True)
class Recovery:
    """One kill -9 run. The defaults are the raw floor's: no lease, no delivery count."""

    system: str
    lease_ms: int = 0
    consumer: str
    hold_s: float
    lease_left_at_kill_ms: float | None = None
    redelivered_while_alive: bool = False
    recovered_s: float | None  # kill -> another consumer has it; None = never (in window)
    window_s: float
    deliveries: int | None = None
    stranded_in_processing: int | None
    error: str | None = None


def crash_belayq(r: redis.Redis, port: int, lease_ms: int, consumer: str, poll_s: float,
                 window_s: float) -> Recovery:
    """Kill -9 a belayq consumer holding a message; time until another consumer has it.

    ``consumer``: ``poll`` = ``claim(timeout=poll_s)`` in a loop; ``blocked`` = one
    ``claim(timeout=window)`` issued before the kill (its first claim registers the queue
    with this process's lease keeper, whose guarded sweep runs every heartbeat);
    ``blocked-nokeeper`` = the same with ``keeper=False``, so only the claim's own sweep
    runs, each time its capped BLMOVE wait ends.
    """
    fresh(r)
    name = f"crash-{uuid.uuid4().hex[:8]}"
    producer = ReliableQueue(r, name, lease_ms=lease_ms, keeper=False)
    observer = ReliableQueue(
        r, name, lease_ms=lease_ms, keeper=consumer != "blocked-nokeeper"
    )
    msg_id = producer.publish(b"crash-me".ljust(100, b"x"))
    child, info = _spawn_child(["belayq", str(port), name, str(lease_ms)])
    try:
        need(info["id"] == msg_id, "child claimed the message")
        t_claim = float(info["t"])
        hold_s = lease_ms / 1000 + 0.5
        got: list[Any] = []
        early = False
        errors: list[str] = []
        if consumer == "poll":
            while not got and time.monotonic() < t_claim + hold_s:
                got = observer.claim(timeout=min(poll_s, t_claim + hold_s - time.monotonic()))
            early = bool(got)
        else:
            box: list[list[Any]] = []

            def wait_blocked() -> None:
                try:
                    box.append(observer.claim(timeout=window_s + hold_s))
                except Exception as exc:  # reported, not raised in a thread
                    errors.append(f"{type(exc).__name__}: {exc}")
                    box.append([])

            # Start blocking BLOCKED_START_S after the holder claimed, so the waiter's BLMOVE
            # (capped at 0.8 x socket_timeout = 4 s) does not happen to end right at expiry.
            time.sleep(max(0.0, t_claim + BLOCKED_START_S - time.monotonic()))
            th = threading.Thread(target=wait_blocked)
            th.start()
            time.sleep(max(0.0, t_claim + hold_s - time.monotonic()))
            early = bool(box and box[0])
        deadline = r.zscore(observer.keys.leases, msg_id)
        left = None if deadline is None else deadline - _server_ms(r)
        t_kill = _kill(child)
        t_got = None
        if not early:
            if consumer == "poll":
                while not got and time.monotonic() < t_kill + window_s:
                    got = observer.claim(timeout=poll_s)
                t_got = time.monotonic() if got else None
            else:
                th.join(window_s + hold_s + 10)
                t_got = time.monotonic()
                got = box[0] if box else []
                if not got:
                    t_got = None
        if early and consumer != "poll":
            th.join()
            got = box[0]
        delivered = got[0].deliveries if got else None
        if got:
            observer.ack_many(got)
        stranded = int(r.llen(observer.keys.processing))
        observer.close(release=False)
        return Recovery(
            system="belayq",
            lease_ms=lease_ms,
            consumer=consumer,
            hold_s=hold_s,
            lease_left_at_kill_ms=left,
            redelivered_while_alive=early,
            recovered_s=None if t_got is None else t_got - t_kill,
            window_s=window_s,
            deliveries=delivered,
            stranded_in_processing=stranded,
            error="; ".join(errors) or None,
        )
    finally:
        if child.poll() is None:
            _kill(child)


def crash_raw(r: redis.Redis, port: int, poll_s: float, window_s: float) -> Recovery:
    """The raw floor: a BLMOVE+LREM consumer killed mid-message; watch with BLMOVE."""
    fresh(r)
    r.lpush(RAW_Q, b"crash-me".ljust(100, b"x"))
    child, _info = _spawn_child(["raw", str(port), RAW_Q, RAW_P])
    try:
        time.sleep(0.5)
        t_kill = _kill(child)
        got = None
        while got is None and time.monotonic() < t_kill + window_s:
            got = r.blmove(RAW_Q, RAW_P, poll_s, "RIGHT", "LEFT")
        t_got = time.monotonic() if got is not None else None
        stranded = int(r.llen(RAW_P)) - (1 if got is not None else 0)
        return Recovery(system="raw BLMOVE+LREM", consumer="poll", hold_s=0.5,
                        recovered_s=None if t_got is None else t_got - t_kill,
                        window_s=window_s, stranded_in_processing=stranded)
    finally:
        if child.poll() is None:
            _kill(child)
