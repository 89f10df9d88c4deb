"""What ``wait_replicas`` costs: publish and claim+ack rates with and without waiting.

``uv run python -m benchmarks.durability`` starts a primary and one replica (its own
redis-servers on free ports, no persistence), then measures, in one run, one-by-one
``publish`` and ``claim(count=1)`` + ``ack`` with ``wait_replicas=0`` (the default,
asynchronous replication) and ``wait_replicas=1`` (each publish and ack waits for the
replica: Redis WAIT, pipelined in the same round trip). Prints rates and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer, redis_server_binary


def _wait_link(replica: redis.Redis) -> None:
    deadline = time.monotonic() + 20
    while replica.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not attach")
        time.sleep(0.05)


def _rates(r: redis.Redis, n: int, wait: int) -> tuple[float, float]:
    q = ReliableQueue(r, f"dur-{uuid.uuid4().hex[:8]}", keeper=False, wait_replicas=wait)
    t0 = time.perf_counter()
    for i in range(n):
        q.publish(b"x" * 100 + str(i).encode())
    publish = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(n):
        [d] = q.claim(timeout=0)
        q.ack(d)
    consume = n / (time.perf_counter() - t0)
    assert q.stats()["ready"] == 0 and q.stats()["in_flight"] == 0
    q.drop()
    return publish, consume


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=3000, help="messages per loop")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    binary = redis_server_binary()
    replica_of = ["--replicaof", "127.0.0.1"]
    with RedisServer(binary) as primary, RedisServer(
        binary, args=[*replica_of, str(primary.port)]
    ) as rep:
        r = redis.Redis(port=primary.port)
        _wait_link(redis.Redis(port=rep.port))
        results: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
        for _ in range(args.reps):
            for wait in (0, 1):
                results[wait].append(_rates(r, args.n, wait))
    med = {w: (statistics.median(p for p, _ in v), statistics.median(c for _, c in v))
           for w, v in results.items()}
    print(f"primary + 1 replica on loopback, {args.n} messages, median of {args.reps} reps")
    print("| wait_replicas | publish msg/s | claim+ack msg/s |")
    print("|---|---|---|")
    for w in (0, 1):
        print(f"| {w} | {med[w][0]:,.0f} | {med[w][1]:,.0f} |")
    print(f"| ratio 1/0 | {med[1][0] / med[0][0]:.2f}x | {med[1][1] / med[0][1]:.2f}x |")


if __name__ == "__main__":
    main()
