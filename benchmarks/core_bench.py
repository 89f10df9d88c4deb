"""belayq core vs the raw redis-py floor, on one private redis-server, in one run.

Run from the repository root::

    .venv/bin/python -m benchmarks.core_bench [--n 20000] [--reps 3] [--json out.json]

What it measures (medians over ``--reps``, with min-max):

* publish msg/s: ``ReliableQueue.publish`` one by one and ``publish_many`` in batches, vs
  ``LPUSH`` one by one and ``LPUSH`` pipelined in the same batches;
* claim+ack msg/s: ``claim(count=1)`` + ``ack`` and ``claim(count=100)`` + ``ack_many``, vs
  the raw floor ``BLMOVE`` + ``LREM`` (2 round trips per message), plus two reference
  floors: the same pair pipelined 100 at a time, and the baseline's smallest loop with a
  lease (Lua ``LMOVE``+``ZADD``, then ``MULTI LREM ZREM EXEC``);
* round trips and commands per message for every loop: round trips and top-level
  commands counted client-side (a counting redis-py ``Connection``; a pipeline is one round
  trip), and every command the server ran (``INFO commandstats`` delta: it includes the
  commands run inside Lua and whatever the lease keeper thread sent);
* Redis bytes per message (``INFO memory used_memory`` delta): queued (belayq id mode vs
  raw ``LPUSH`` of the same payloads) and in flight (claimed, not acked);
* recovery after ``kill -9``: a child process claims a message (``lease_ms`` 2000 and
  5000), holds it for longer than its lease (its keeper extends it; a consumer watching
  the queue must not get it meanwhile), and is SIGKILLed; the time until another consumer
  receives it. The raw floor (a ``BLMOVE`` consumer killed mid-message) is watched for a
  while to show that it never comes back.

The server is started here (``belayq.embedded.RedisServer`` on a free port, never 6379)
and stopped at the end. The numbers are noisy on a shared 2-core box: client, server and
any other load share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

import belayq
from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.keeper import KEEPER

ROOT = Path(__file__).resolve().parent.parent

# -- counting client ---------------------------------------------------------------------

# thread name -> [round trips, top-level commands]; each thread only touches its own row.
_COUNTS: dict[str, list[int]] = {}


def _row() -> list[int]:
    name = threading.current_thread().name
    row = _COUNTS.get(name)
    if row is None:
        row = _COUNTS.setdefault(name, [0, 0])
    return row


class _CountingPacker:
    """Wraps redis-py's command packer: one ``pack`` = one command sent."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def pack(self, *args: Any) -> Any:
        _row()[1] += 1
        return self._inner.pack(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountingConnection(redis.Connection):
    """A redis-py connection that counts round trips (one ``send_packed_command`` = one
    write followed by reading the replies) and commands, per thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command_packer = _CountingPacker(self._command_packer)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        _row()[0] += 1
        super().send_packed_command(command, check_health)


def make_client(port: int) -> redis.Redis:
    # socket_timeout=5 is what redis.Redis(host, port) puts in the pool's kwargs itself; a
    # bare ConnectionPool leaves it out (the connection still times out reads at 5 s) and
    # belayq would then block in BLMOVE for as long as the read timeout (see the report).
    pool = redis.ConnectionPool(
        connection_class=CountingConnection, host="127.0.0.1", port=port,
        socket_timeout=5, socket_connect_timeout=5,
    )
    return redis.Redis(connection_pool=pool)


def counts(thread: str = "MainThread") -> tuple[int, int]:
    row = _COUNTS.get(thread, [0, 0])
    return row[0], row[1]


def server_calls(r: redis.Redis) -> tuple[int, int, int]:
    """Every command the server has run (INFO commandstats, Lua-internal calls included);
    the server usec of scripts and functions; the usec of all commands but INFO (which
    counts Lua-internal calls twice: use it where no script ran)."""
    info = r.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_"))
    lua = ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval")
    lua_usec = sum(int(info[k]["usec"]) for k in lua if k in info)
    all_usec = sum(int(v["usec"]) for k, v in info.items()
                   if k.startswith("cmdstat_") and not k.startswith("cmdstat_info"))
    return calls, lua_usec, all_usec


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Sample:
    """One timed loop."""

    msgs: int
    seconds: float
    rate: float
    rt_per_msg: float
    cmds_per_msg: float
    server_cmds_per_msg: float
    keeper_rt: int
    server_usec_per_msg: float = 0.0


def measure(r: redis.Redis, n: int, fn: Callable[[], None]) -> Sample:
    srv0, lua0, all0 = server_calls(r)
    rt0, cmd0 = counts()
    krt0, _ = counts("belayq-lease-keeper")
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    rt1, cmd1 = counts()
    krt1, _ = counts("belayq-lease-keeper")
    srv1, lua1, all1 = server_calls(r)
    # srv1 includes the first INFO itself; the client counters exclude both INFOs.
    return Sample(
        msgs=n,
        seconds=dt,
        rate=n / dt,
        rt_per_msg=(rt1 - rt0) / n,
        cmds_per_msg=(cmd1 - cmd0) / n,
        server_cmds_per_msg=(srv1 - srv0 - 1) / n,
        keeper_rt=krt1 - krt0,
        server_usec_per_msg=((lua1 - lua0) or (all1 - all0)) / n,
    )


def make_payloads(n: int, size: int, tag: bytes) -> list[bytes]:
    return [(b"%s-%08d-" % (tag, i)).ljust(size, b"x")[:size] for i in range(n)]


def fresh(r: redis.Redis) -> None:
    """Empty the database (scripts stay cached) between loops, outside the timing."""
    r.flushdb(asynchronous=False)


def chunks(seq: Sequence[bytes], size: int) -> list[Sequence[bytes]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise RuntimeError(f"benchmark invariant broken: {what}")


def queue(r: redis.Redis, **options: Any) -> ReliableQueue:
    return ReliableQueue(r, f"bench-{uuid.uuid4().hex[:8]}", **options)


def check_drained(q: ReliableQueue) -> None:
    s = q.stats()
    _need(s["ready"] == 0 and s["in_flight"] == 0 and s["leased"] == 0, f"drained: {s}")


# -- the throughput loops ----------------------------------------------------------------

BLOCKED_START_S = 1.0
RAW_CLAIM_LUA = (
    "local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT') "
    "if v then redis.call('ZADD', KEYS[3], ARGV[1], v) end return v"
)


def run_throughput(r: redis.Redis, n: int, size: int, batch: int) -> dict[str, Sample]:
    """One rep of every loop, belayq and raw interleaved. Returns samples by loop name."""
    out: dict[str, Sample] = {}
    pl = make_payloads(n, size, b"m")
    batches = chunks(pl, batch)
    rq, rp, rz = "raw:q", "raw:p", "raw:lease"

    # publish, one by one
    fresh(r)

    def raw_lpush() -> None:
        for p in pl:
            r.lpush(rq, p)

    out["raw_lpush"] = measure(r, n, raw_lpush)
    _need(r.llen(rq) == n, "raw lpush count")

    fresh(r)
    q = queue(r)

    def bq_publish() -> None:
        for p in pl:
            q.publish(p)

    out["bq_publish"] = measure(r, n, bq_publish)
    _need(q.stats()["ready"] == n, "belayq publish count")

    # publish, batched
    fresh(r)

    def raw_lpush_pipe() -> None:
        for b in batches:
            pipe = r.pipeline(transaction=False)
            for p in b:
                pipe.lpush(rq, p)
            pipe.execute()

    out["raw_lpush_pipe"] = measure(r, n, raw_lpush_pipe)
    _need(r.llen(rq) == n, "raw lpush pipe count")

    fresh(r)
    q = queue(r)

    def bq_publish_many() -> None:
        for b in batches:
            q.publish_many(b)

    out["bq_publish_many"] = measure(r, n, bq_publish_many)
    _need(q.stats()["ready"] == n, "belayq publish_many count")

    # claim + ack, one at a time: raw floor BLMOVE + LREM
    fresh(r)
    for b in batches:
        r.lpush(rq, *b)

    def raw_blmove_lrem() -> None:
        for _ in range(n):
            v = r.blmove(rq, rp, 1, "RIGHT", "LEFT")
            _need(v is not None, "raw blmove got nothing")
            r.lrem(rp, 1, v)

    out["raw_blmove_lrem"] = measure(r, n, raw_blmove_lrem)
    _need(r.llen(rq) == 0 and r.llen(rp) == 0, "raw floor drained")

    # belayq claim(count=1) + ack: as the library's functions (the default on 7.0+) and as
    # scripts (lua_functions=False, what 6.2, clusters and restricted ACL users run)
    no_functions = {"lua_functions": False}
    for loop, options in (("bq_claim1_ack", {}), ("bq_claim1_ack_scripts", no_functions)):
        fresh(r)
        q = queue(r, **options)
        for b in batches:
            q.publish_many(b)

        def bq_claim1(q: ReliableQueue = q) -> None:
            done = 0
            while done < n:
                got = q.claim(timeout=1.0, count=1)
                _need(len(got) == 1, "claim(count=1) got nothing")
                _need(q.ack(got[0]), "ack refused")
                done += 1

        out[loop] = measure(r, n, bq_claim1)
        check_drained(q)
        q.close(release=False)

    # belayq's steady state with prefetch 1: the ack of one and the claim of the next in one
    # round trip (ack_and_claim)
    fresh(r)
    q = queue(r)
    for b in batches:
        q.publish_many(b)

    def bq_ack_and_claim() -> None:
        [held] = q.claim(timeout=1.0, count=1)
        for _ in range(n - 1):
            acked, got = q.ack_and_claim([held], 1)
            _need(acked == [True] and len(got) == 1, "ack_and_claim")
            held = got[0]
        _need(q.ack(held), "last ack refused")

    out["bq_ack_and_claim"] = measure(r, n, bq_ack_and_claim)
    check_drained(q)
    q.close(release=False)

    # belayq claim(count=100) + ack_many
    fresh(r)
    q = queue(r)
    for b in batches:
        q.publish_many(b)

    def bq_claim100() -> None:
        done = 0
        while done < n:
            got = q.claim(timeout=1.0, count=batch)
            _need(bool(got), "claim(count=batch) got nothing")
            _need(all(q.ack_many(got)), "ack_many refused")
            done += len(got)

    out["bq_claim100_ack_many"] = measure(r, n, bq_claim100)
    check_drained(q)
    q.close(release=False)

    # reference floor: LMOVE x batch pipelined + LREM x batch pipelined
    fresh(r)
    for b in batches:
        r.lpush(rq, *b)

    def raw_pipe_floor() -> None:
        done = 0
        while done < n:
            pipe = r.pipeline(transaction=False)
            for _ in range(batch):
                pipe.lmove(rq, rp, "RIGHT", "LEFT")
            got = [v for v in pipe.execute() if v is not None]
            _need(bool(got), "raw pipelined lmove got nothing")
            pipe = r.pipeline(transaction=False)
            for v in got:
                pipe.lrem(rp, -1, v)
            pipe.execute()
            done += len(got)

    out["raw_pipe_floor"] = measure(r, n, raw_pipe_floor)
    _need(r.llen(rq) == 0 and r.llen(rp) == 0, "raw pipelined floor drained")

    # reference floor with a lease: Lua LMOVE+ZADD, then MULTI LREM ZREM EXEC
    fresh(r)
    for b in batches:
        r.lpush(rq, *b)
    claim = r.register_script(RAW_CLAIM_LUA)
    r.script_load(RAW_CLAIM_LUA)

    def raw_lua_floor() -> None:
        for _ in range(n):
            v = claim(keys=[rq, rp, rz], args=[int(time.time() * 1000) + 30_000])
            _need(v is not None, "raw lua claim got nothing")
            pipe = r.pipeline(transaction=True)
            pipe.lrem(rp, 1, v)
            pipe.zrem(rz, v)
            pipe.execute()

    out["raw_lua_floor"] = measure(r, n, raw_lua_floor)
    _need(r.llen(rp) == 0 and r.zcard(rz) == 0, "raw lua floor drained")
    fresh(r)
    return out


# -- memory ------------------------------------------------------------------------------


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def drop_transient(r: redis.Redis, q: ReliableQueue) -> tuple[int, float]:
    """Delete the queue's short-lived memo records (replies kept for re-sent publish and
    claim calls, which the scripts drop after ``reply_window_ms``) and return how many there
    were and that window (s)."""
    count = int(r.hlen(q.keys.memo))
    r.delete(q.keys.memo, q.keys.memo_exp)
    return count, q.config.reply_window_ms / 1000


def run_memory(r: redis.Redis, n: int, size: int, batch: int) -> dict[str, float]:
    """Bytes per message, queued and in flight, belayq (id mode) and raw lists.

    The belayq figures are taken twice: with everything the calls left behind, and again
    after deleting the keys that have a TTL (transient records), i.e. the steady state.
    """
    pl = make_payloads(n, size, b"mem")
    batches = chunks(pl, batch)
    out: dict[str, float] = {}

    fresh(r)
    q = queue(r, keeper=False, lease_ms=600_000)
    m0 = used_memory(r)
    for b in batches:
        q.publish_many(b)
    m1 = used_memory(r)
    k = q.keys
    one = r.lindex(k.ready, 0)
    _need(one is not None, "memory: nothing queued")
    out["bq_payloads_queued"] = float(r.memory_usage(k.payloads, samples=0) or 0) / n
    out["bq_ready_list"] = float(r.memory_usage(k.ready, samples=0) or 0) / n
    n_tr, ttl = drop_transient(r, q)
    m1s = used_memory(r)
    out["bq_transient_after_publish"] = n_tr / n
    out["bq_transient_ttl_s"] = ttl
    claimed = 0
    while claimed < n:
        got, _ = q.try_claim(batch)
        _need(bool(got), "memory: claim got nothing")
        claimed += len(got)
    m2 = used_memory(r)
    out["bq_meta_inflight"] = float(r.memory_usage(k.meta, samples=0) or 0) / n
    out["bq_processing_list"] = float(r.memory_usage(k.processing, samples=0) or 0) / n
    out["bq_leases_zset"] = float(r.memory_usage(k.leases, samples=0) or 0) / n
    n_tr, ttl = drop_transient(r, q)
    m2s = used_memory(r)
    out["bq_transient_after_claim"] = n_tr / n
    out["bq_queued"] = (m1 - m0) / n
    out["bq_queued_steady"] = (m1s - m0) / n
    out["bq_inflight"] = (m2 - m1s + m1 - m0) / n
    out["bq_inflight_steady"] = (m2s - m0) / n
    out["bq_inflight_extra"] = (m2s - m1s) / n

    fresh(r)
    m0 = used_memory(r)
    for b in batches:
        pipe = r.pipeline(transaction=False)
        for p in b:
            pipe.lpush("raw:q", p)
        pipe.execute()
    m1 = used_memory(r)
    out["raw_list"] = float(r.memory_usage("raw:q", samples=0) or 0) / n
    moved = 0
    while moved < n:
        pipe = r.pipeline(transaction=False)
        for _ in range(batch):
            pipe.lmove("raw:q", "raw:p", "RIGHT", "LEFT")
        moved += sum(v is not None for v in pipe.execute())
    m2 = used_memory(r)
    out["raw_queued"] = (m1 - m0) / n
    out["raw_inflight"] = (m2 - m0) / n
    out["raw_inflight_extra"] = (m2 - m1) / n
    fresh(r)
    return out


# -- recovery after kill -9 --------------------------------------------------------------


def _child_main(argv: list[str]) -> None:
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
        [sys.executable, "-m", "benchmarks.core_bench", "--child", *args],
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


@dataclass
class Recovery:
    """One kill -9 run."""

    system: str
    lease_ms: int
    consumer: str
    hold_s: float
    lease_left_at_kill_ms: float | None
    redelivered_while_alive: bool
    recovered_s: float | None  # kill -> another consumer has it; None = never (in window)
    window_s: float
    deliveries: int | None
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
        _need(info["id"] == msg_id, "child claimed the message")
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
    src, dst = "raw:q", "raw:p"
    r.lpush(src, b"crash-me".ljust(100, b"x"))
    child, _info = _spawn_child(["raw", str(port), src, dst])
    try:
        time.sleep(0.5)
        t_kill = _kill(child)
        got = None
        while got is None and time.monotonic() < t_kill + window_s:
            got = r.blmove(src, dst, poll_s, "RIGHT", "LEFT")
        t_got = time.monotonic() if got is not None else None
        stranded = int(r.llen(dst)) - (1 if got is not None else 0)
        return Recovery(
            system="raw BLMOVE+LREM",
            lease_ms=0,
            consumer="poll",
            hold_s=0.5,
            lease_left_at_kill_ms=None,
            redelivered_while_alive=False,
            recovered_s=None if t_got is None else t_got - t_kill,
            window_s=window_s,
            deliveries=None,
            stranded_in_processing=stranded,
        )
    finally:
        if child.poll() is None:
            _kill(child)


# -- reporting ---------------------------------------------------------------------------


def med(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def span(values: Sequence[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(med(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def source_state() -> str:
    """Where belayq was imported from, and the git state of that checkout's core."""
    src = Path(belayq.__file__).resolve().parent
    try:
        def git(*cmd: str) -> str:
            return subprocess.run(
                ["git", "-C", str(src), *cmd], capture_output=True, text=True, check=True
            ).stdout.strip()

        head = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", "."))
        return f"{src} (git {head}{', core modified' if dirty else ''})"
    except (OSError, subprocess.CalledProcessError):
        return f"{src} (not a git checkout)"


def environment(r: redis.Redis, port: int) -> dict[str, Any]:
    try:
        import hiredis

        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = None
    conn = r.connection_pool.get_connection()
    try:
        protocol = conn.protocol
    finally:
        r.connection_pool.release(conn)
    return {
        "redis_version": r.info("server")["redis_version"],
        "redis_port": port,
        "redis_py": redis.__version__,
        "hiredis": bool(redis.utils.HIREDIS_AVAILABLE),
        "hiredis_version": hiredis_version,
        "resp_protocol": protocol,
        "python": platform.python_version(),
        "belayq": belayq.__version__,
        "belayq_source": source_state(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "loadavg_start": os.getloadavg(),
        "platform": platform.platform(),
    }


THROUGHPUT_ROWS = [
    # (label, belayq loop, raw loop)
    ("publish, one by one", "bq_publish", "raw_lpush"),
    ("publish, batches of {b}", "bq_publish_many", "raw_lpush_pipe"),
    ("claim+ack, count=1", "bq_claim1_ack", "raw_blmove_lrem"),
    ("claim+ack, count=1, as scripts", "bq_claim1_ack_scripts", "raw_blmove_lrem"),
    ("ack_and_claim, count=1 (1 round trip)", "bq_ack_and_claim", "raw_blmove_lrem"),
    ("claim+ack, count={b} (vs unbatched floor)", "bq_claim100_ack_many", "raw_blmove_lrem"),
    ("claim+ack, count={b} (vs batched floor)", "bq_claim100_ack_many", "raw_pipe_floor"),
    ("claim+ack, count=1 (vs Lua lease floor)", "bq_claim1_ack", "raw_lua_floor"),
]

LOOP_LABELS = {
    "bq_publish": "belayq publish()",
    "bq_publish_many": "belayq publish_many({b})",
    "bq_claim1_ack": "belayq claim(count=1) + ack",
    "bq_claim1_ack_scripts": "belayq claim(count=1) + ack, lua_functions=False",
    "bq_ack_and_claim": "belayq ack_and_claim(count=1)",
    "bq_claim100_ack_many": "belayq claim(count={b}) + ack_many",
    "raw_lpush": "raw LPUSH",
    "raw_lpush_pipe": "raw LPUSH pipelined {b}",
    "raw_blmove_lrem": "raw BLMOVE + LREM",
    "raw_pipe_floor": "raw LMOVE x{b} pipe + LREM x{b} pipe",
    "raw_lua_floor": "raw Lua(LMOVE+ZADD) + MULTI(LREM,ZREM)",
}


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(header), sep, *(fmt(r) for r in rows)])


def report(res: dict[str, Any]) -> str:
    a = res["args"]
    b = a["batch"]
    env = res["env"]
    loops: dict[str, list[dict[str, Any]]] = res["throughput"]
    out = []
    out.append(
        f"belayq core_bench: n={a['n']} reps={a['reps']} payload={a['payload_bytes']} B "
        f"batch={b} elapsed={res['elapsed_s']:.0f} s"
    )
    hiredis_txt = f"yes {env['hiredis_version']}" if env["hiredis"] else "no"
    out.append(
        f"env: redis-server {env['redis_version']} (port {env['redis_port']}), "
        f"redis-py {env['redis_py']}, hiredis {hiredis_txt}, "
        f"RESP{env['resp_protocol']}, Python {env['python']}, "
        f"belayq {env['belayq']} from {env['belayq_source']}, "
        f"CPUs {env['cpu_count']} (usable {env['cpus_usable']}), "
        f"load avg start {env['loadavg_start'][0]:.2f} end {res['loadavg_end'][0]:.2f}"
    )

    def rates(name: str) -> list[float]:
        return [s["rate"] for s in loops[name]]

    out.append("\n## Throughput (msg/s, median (min-max) over reps)\n")
    rows = []
    for label, bq, raw in THROUGHPUT_ROWS:
        ratio = med(rates(bq)) / med(rates(raw))
        paired = [x / y for x, y in zip(rates(bq), rates(raw), strict=True)]
        rows.append([
            label.format(b=b),
            span(rates(bq), ",.0f"),
            LOOP_LABELS[raw].format(b=b),
            span(rates(raw), ",.0f"),
            f"{ratio:.2f}",
            span(paired, ".2f"),
        ])
    out.append(table(
        ["loop", "belayq msg/s", "raw loop", "raw msg/s", "belayq/raw", "same-rep ratios"], rows
    ))
    out.append(
        "belayq/raw = ratio of the medians; same-rep ratios = median (min-max) of each rep's "
        "belayq/raw, measured seconds apart, which cancels part of the host's drift."
    )

    out.append("\n## Round trips and commands per message (median over reps)\n")
    rows = []
    for name, label in LOOP_LABELS.items():
        ss = loops[name]
        rows.append([
            label.format(b=b),
            f"{med([s['rt_per_msg'] for s in ss]):.3f}",
            f"{med([s['cmds_per_msg'] for s in ss]):.3f}",
            f"{med([s['server_cmds_per_msg'] for s in ss]):.2f}",
            f"{med([s.get('server_usec_per_msg', 0.0) for s in ss]):.1f}",
            str(sum(s["keeper_rt"] for s in ss)),
        ])
    out.append(table(
        ["loop", "RT/msg", "cmds/msg sent", "cmds/msg run by server", "server us/msg",
         "keeper RTs (all reps)"],
        rows,
    ))
    out.append(
        "RT = client writes+reads (a pipeline or MULTI block is 1); 'sent' = top-level commands "
        "the client sent; 'run by server' = INFO commandstats delta, which counts every "
        "command inside Lua and the lease keeper's heartbeats too; 'server us/msg' = server time "
        "of the scripts or functions (of the raw commands, for a raw loop) per message."
    )

    mem = res["memory"]
    out.append(
        "\n## Redis memory per message "
        f"(used_memory delta / n, {a['payload_bytes']} B payload)\n"
    )
    rows = []
    for label, bq, raw in [
        ("queued, right after publish", "bq_queued", "raw_queued"),
        ("queued, steady (TTL'd keys gone)", "bq_queued_steady", "raw_queued"),
        ("in flight, right after claim", "bq_inflight", "raw_inflight"),
        ("in flight, steady (TTL'd keys gone)", "bq_inflight_steady", "raw_inflight"),
        ("extra for being in flight, steady", "bq_inflight_extra", "raw_inflight_extra"),
    ]:
        bv = [m[bq] for m in mem]
        rv = [m[raw] for m in mem]
        mem_ratio = f"{med(bv) / med(rv):.2f}" if abs(med(rv)) > 5 else "-"
        rows.append([label, span(bv, ".0f"), span(rv, ".0f"), mem_ratio])
    out.append(table(["state", "belayq id mode B/msg", "raw list B/msg", "belayq/raw"], rows))

    def m(key: str) -> str:
        return f"{med([x[key] for x in mem]):.0f}"

    out.append(
        f"MEMORY USAGE breakdown (B per message): payloads hash {m('bq_payloads_queued')}, "
        f"ready list {m('bq_ready_list')}; claimed: meta hash {m('bq_meta_inflight')}, "
        f"leases zset {m('bq_leases_zset')}, landing list {m('bq_processing_list')}; "
        f"raw list {m('raw_list')}. used_memory also counts allocator slack and hash "
        "tables grown in powers of 2, so the deltas differ from the sum."
    )
    tr_pub = med([x.get("bq_transient_after_publish", 0.0) for x in mem])
    tr_claim = med([x.get("bq_transient_after_claim", 0.0) for x in mem])
    out.append(
        f"Memo records (re-send replies) per message: {tr_pub:.2f} after publish_many({b}), "
        f"{tr_claim:.3f} after claim(count={b}) (longest TTL "
        f"{med([x.get('bq_transient_ttl_s', 0.0) for x in mem]):.0f} s); 'right after' "
        "includes them, 'steady' is measured after deleting them. Under a sustained "
        "rate they cost about rate x TTL x their size."
    )

    out.append("\n## Recovery after kill -9 of the consumer holding the message\n")
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for rec in res["recovery"]:
        groups.setdefault((rec["system"], rec["lease_ms"], rec["consumer"]), []).append(rec)
    consumer_text = {
        "poll": f"claim(timeout={a['poll_s']}) in a loop",
        "blocked": "one blocked claim() (its keeper sweeps)",
        "blocked-nokeeper": "one blocked claim(), keeper=False",
    }
    rows = []
    for (system, lease, consumer), recs in groups.items():
        rec_s = [x["recovered_s"] for x in recs if x["recovered_s"] is not None]
        never = len(recs) - len(rec_s)
        if system != "belayq":
            rec_txt = f"never: not in {recs[0]['window_s']:.0f} s ({never}/{len(recs)} runs)"
            left_txt, early_txt, deliv_txt = "no lease", "-", "-"
            label = "raw: BLMOVE q p loop (timeout " + str(a["poll_s"]) + " s)"
            strand = str(recs[0]["stranded_in_processing"])
        else:
            rec_txt = span(rec_s, ".2f") if rec_s else "never"
            if never and rec_s:
                rec_txt += f"; {never} never"
            lefts = [
                x["lease_left_at_kill_ms"] for x in recs if x["lease_left_at_kill_ms"] is not None
            ]
            left_txt = span(lefts, ".0f") if lefts else "-"
            early_txt = str(sum(x["redelivered_while_alive"] for x in recs))
            deliv_txt = ",".join(str(x["deliveries"]) for x in recs)
            label = consumer_text[consumer]
            strand = str(max(x["stranded_in_processing"] or 0 for x in recs))
        rows.append([
            system, str(lease) if lease else "-", label, str(len(recs)), left_txt,
            rec_txt, early_txt, deliv_txt, strand,
        ])
    out.append(table(
        ["system", "lease_ms", "other consumer", "runs", "lease left at kill ms",
         "kill -> redelivered s", "redelivered before kill", "delivery no.", "stuck in processing"],
        rows,
    ))
    out.append(
        "The dying consumer held the message for lease+0.5 s before the kill, so its keeper "
        "had to extend the lease; 'redelivered before kill' counts runs where the watching "
        "consumer got it while the holder was alive (should be 0)."
    )
    return "\n".join(out)


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child_main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=20000, help="messages per throughput loop")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every measurement")
    ap.add_argument("--batch", type=int, default=100, help="publish_many/claim count batch")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--leases", type=int, nargs="+", default=[2000, 5000],
                    help="lease_ms values of the kill -9 runs")
    ap.add_argument("--poll-s", type=float, default=0.25,
                    help="claim(timeout=...) of the watching consumer in the kill -9 runs")
    ap.add_argument("--crash-reps", type=int, default=None,
                    help="kill -9 runs per lease (default: --reps)")
    ap.add_argument("--raw-window", type=float, default=10.0,
                    help="seconds to watch the killed raw consumer's message")
    ap.add_argument("--blocked-reps", type=int, default=1,
                    help="kill -9 runs of each blocked-claim() variant (0 = skip them; "
                    "their timing is set by the sweep period and the BLMOVE cap)")
    ap.add_argument("--json", type=Path, help="write every rep's numbers here")
    args = ap.parse_args(argv)
    crash_reps = args.reps if args.crash_reps is None else args.crash_reps

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    t_start = time.monotonic()
    with RedisServer() as server:
        if server.port == 6379:
            raise RuntimeError("refusing to benchmark on port 6379")
        r = make_client(server.port)
        r.ping()
        res: dict[str, Any] = {
            "args": {
                "n": args.n, "reps": args.reps, "batch": args.batch,
                "payload_bytes": args.payload_bytes, "leases": args.leases,
                "poll_s": args.poll_s, "crash_reps": crash_reps,
                "raw_window_s": args.raw_window, "blocked_reps": args.blocked_reps,
            },
            "env": environment(r, server.port),
        }
        throughput: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.reps):
            progress(f"throughput rep {rep + 1}/{args.reps}")
            for name, sample in run_throughput(r, args.n, args.payload_bytes, args.batch).items():
                throughput.setdefault(name, []).append(asdict(sample))
        res["throughput"] = throughput

        memory = []
        for rep in range(args.reps):
            progress(f"memory rep {rep + 1}/{args.reps}")
            memory.append(run_memory(r, args.n, args.payload_bytes, args.batch))
        res["memory"] = memory

        recovery = []
        window = max(args.leases) / 1000 + 10
        runs = [(lease, "poll", crash_reps) for lease in args.leases]
        runs += [(min(args.leases), c, args.blocked_reps) for c in ("blocked", "blocked-nokeeper")]
        for rep in range(max(crash_reps, args.blocked_reps)):
            for lease, consumer, reps in runs:
                if rep >= reps:
                    continue
                progress(f"kill -9 rep {rep + 1}/{reps}, lease_ms={lease}, {consumer}")
                rec = crash_belayq(r, server.port, lease, consumer, args.poll_s, window)
                recovery.append(asdict(rec))
        progress(f"kill -9 of a raw BLMOVE consumer, watching {args.raw_window:.0f} s")
        recovery.append(asdict(crash_raw(r, server.port, args.poll_s, args.raw_window)))
        res["recovery"] = recovery
        res["loadavg_end"] = os.getloadavg()
        res["elapsed_s"] = time.monotonic() - t_start
        r.close()
    res["keeper_ticks"] = KEEPER.ticks
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
