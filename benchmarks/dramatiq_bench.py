"""Stock Dramatiq ``RedisBroker`` vs ``belayq_dramatiq.Broker``, side by side on one private
redis-server, in one run.

Run from the repository root::

    .venv/bin/python -m benchmarks.dramatiq_bench [--n 5000] [--threads 8] [--reps 3] [--json out]

What it measures (medians over ``--reps``, stock and belayq alternating in every rep, with
min-max), reported as belayq/stock ratios (target >= 1.0x), for belayq in stock's keys
(``belayq``, the default; ``belayq-strict``: with ``strict_runs``, a start report sent
before each run) and in its own (``belayq-own``: ``shards=1``, the bodies in the core's
payloads):

* ``enqueue``: N x ``actor.send()`` of a no-op actor;
* ``drain``: a Dramatiq ``Worker`` (``--threads`` worker threads, Dramatiq's default
  prefetch) started on N queued messages, timed from its start until the last message is
  acked (``broker.join`` polled every 10 ms). The worker runs in this process, so no
  process start is timed, and both brokers pay the same Python costs of Dramatiq's worker.

The server is started here (``belayq.embedded.RedisServer``, a free port, never 6379) and
stopped at the end. Other load on a shared box moves the numbers; compare the ratios of
one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker

import belayq_dramatiq
from belayq.embedded import RedisServer
from benchmarks.stats import med, spread

QUEUE = "bench"


#: The stacks measured: stock RedisBroker; belayq in stock's keys, the same with
#: ``strict_runs``, and belayq in its own keys.
KINDS = ("stock", "belayq", "belayq-strict", "belayq-own")


def make(kind: str, url: str) -> dramatiq.Broker:
    if kind == "stock":
        return RedisBroker(url=url)
    return belayq_dramatiq.Broker(url=url, shards=1 if kind == "belayq-own" else None,
                                  strict_runs=kind == "belayq-strict")


def one(kind: str, url: str, n: int, threads: int) -> dict[str, float]:
    """Enqueue ``n`` no-op messages, then drain them with a worker; rates in messages/s."""
    redis.Redis.from_url(url).flushall()
    broker = make(kind, url)
    dramatiq.set_broker(broker)
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    @dramatiq.actor(queue_name=QUEUE, max_retries=0, broker=broker)
    def noop() -> None:
        with lock:
            count[0] += 1
            if count[0] == n:
                done.set()

    t0 = time.perf_counter()
    for _ in range(n):
        noop.send()
    enqueue_s = time.perf_counter() - t0
    worker = Worker(broker, worker_threads=threads, worker_timeout=100)
    t0 = time.perf_counter()
    worker.start()
    if not done.wait(600):
        raise SystemExit(f"{kind}: the worker ran {count[0]} of {n} messages in 600 s")
    broker.join(QUEUE, interval=10, timeout=60_000)
    drain_s = time.perf_counter() - t0
    worker.stop()
    broker.close()
    return {"enqueue": n / enqueue_s, "drain": n / drain_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    server = RedisServer().start()
    url = f"redis://127.0.0.1:{server.port}/0"
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    try:
        for rep in range(args.reps):  # each rep in another order
            order = KINDS[rep % len(KINDS):] + KINDS[:rep % len(KINDS)]
            for kind in order:
                runs[kind].append(one(kind, url, args.n, args.threads))
    finally:
        server.stop()
    print(f"Dramatiq {dramatiq.__version__}, {args.n} messages, {args.threads} worker "
          f"threads, {args.reps} reps, Python {platform.python_version()}")
    print(f"{'':10} " + " ".join(f"{k + ' msg/s':>22} {'ratio':>7}" for k in KINDS))
    out: dict[str, Any] = {"n": args.n, "threads": args.threads, "reps": args.reps}
    for what in ("enqueue", "drain"):
        stock = med([r[what] for r in runs["stock"]])
        cells, out[what] = [], {}
        for kind in KINDS:
            rates = [r[what] for r in runs[kind]]
            cells.append(f"{spread(rates, '.0f'):>22} {med(rates) / stock:>6.2f}x")
            out[what][kind] = {"rates": rates, "ratio": med(rates) / stock}
        print(f"{what:10} " + " ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
