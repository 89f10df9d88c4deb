"""``python -m benchmarks.kombu_bench --only eta``: a worker under 100,000 waiting countdown
tasks, on the stock ``redis://`` transport and on ``belayq://``, in one run.

For each transport, on a fresh queue and one ``celery worker`` (prefork -c 2, Celery's
defaults: acks_late off, prefetch multiplier 4):

1. with no ETA task waiting: a burst of immediate noops is drained (throughput), a paced
   stream of immediate tasks is timed from publish to start (p50/p99 latency), the
   worker's RSS (main process and pool children) is read, and the Redis server's time per
   second is read over an idle window (``INFO commandstats``: every command but INFO),
   once belayq has trimmed the publish replies it keeps for re-sent publishes (each for
   ``reply_window_ms``; after 100,000 publishes the sweeps take a minute or two to drop
   them, a cost of the burst and not of the tasks waiting; how long is reported);
2. ``--eta-n`` tasks with a 10-minute countdown are published and the worker is given
   time to take what it will (the stock worker holds each one, unacked, in memory);
3. the same measurements with them waiting;
4. the worker is restarted (SIGTERM, a new worker) and the time until a fresh immediate
   task runs is measured.

Ratios are belayq with the ETA tasks waiting / belayq with none (the target: RSS and
server time do not grow, throughput >= 0.9x), and belayq / stock.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from benchmarks import kombu_bench as kb
from benchmarks.stats import med

COUNTDOWN_S = 600.0


def rss_mb(proc: subprocess.Popen[bytes]) -> float:
    """Resident memory of a worker: its main process and pool children (MB)."""
    pids = [proc.pid]
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    pids += [int(p) for p in out.stdout.split()]
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def server_usec(r: redis.Redis) -> int:
    info = r.info("commandstats")
    return sum(int(v["usec"]) for k, v in info.items()
               if k.startswith("cmdstat_") and not k.startswith("cmdstat_info"))


def idle_server_ms_per_s(r: redis.Redis, window_s: float) -> float:
    """Server time spent per second while no task is published or run (ms/s): the
    transports' own upkeep (belayq: lease extends and sweeps; stock: its unacked restore)."""
    before = server_usec(r)
    time.sleep(window_s)
    return (server_usec(r) - before) / 1000 / window_s


def drain(r: redis.Redis, queue: str, n: int, worker: subprocess.Popen[bytes]) -> float:
    """Publish ``n`` noops at once and time the worker draining them (tasks/s)."""
    key = f"done:{queue}:{uuid.uuid4().hex[:6]}"
    results = redis.Redis(port=r.connection_pool.connection_kwargs["port"], db=1)
    t0 = time.time()
    for _ in range(n):
        kb.stamp.delay(key, t0)
    started = time.perf_counter()
    while results.llen(key) < n:
        if worker.poll() is not None:
            raise RuntimeError("worker exited")
        time.sleep(0.01)
    return n / (time.perf_counter() - started)


def latency(r: redis.Redis, queue: str, n: int, rate: float) -> list[float]:
    """Publish ``n`` tasks paced at ``rate`` per second; each one's publish-to-start (s)."""
    key = f"lat:{queue}:{uuid.uuid4().hex[:6]}"
    results = redis.Redis(port=r.connection_pool.connection_kwargs["port"], db=1)
    t0 = time.perf_counter()
    for i in range(n):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        kb.stamp.delay(key, time.time())
    deadline = time.monotonic() + 120
    while results.llen(key) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return [float(x) for x in results.lrange(key, 0, -1)]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def replies_trimmed_s(r: redis.Redis, queue: str, scheme: str, limit_s: float = 600) -> float:
    """Wait until belayq kept no publish reply (its memo hash is empty); how long (s)."""
    if scheme != "belayq":
        return 0.0
    from belayq import ReliableQueue
    from belayq.keys import kombu_layout

    memo = ReliableQueue(r, queue, keeper=False, **kombu_layout(queue)).keys.memo  # type: ignore[arg-type]
    t0 = time.monotonic()
    while r.hlen(memo) and time.monotonic() - t0 < limit_s:
        time.sleep(0.5)
    return time.monotonic() - t0


def measure(r: redis.Redis, queue: str, worker: subprocess.Popen[bytes],
            args: Any, scheme: str) -> dict[str, float]:
    lat = latency(r, queue, args.eta_stream, args.eta_rate)
    out = {
        "throughput": drain(r, queue, args.eta_burst, worker),
        "p50_ms": percentile(lat, 0.5) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "rss_mb": rss_mb(worker),
        "replies_trimmed_s": replies_trimmed_s(r, queue, scheme),
    }
    out["idle_server_ms_per_s"] = idle_server_ms_per_s(r, args.eta_idle)
    return out


def waiting_taken(scheme: str, r: redis.Redis, queue: str, n: int) -> bool:
    """Whether the worker took what it will of the ETA tasks (stock: it holds them all;
    belayq: they all wait in the queue's delayed set)."""
    if scheme == "redis":
        return r.hlen("unacked") >= n
    import kombu

    port = r.connection_pool.connection_kwargs["port"]
    with kombu.Connection(kb.url("belayq", port)) as conn:
        return int(conn.default_channel.queue(queue).stats()["delayed"]) >= n


def one_transport(scheme: str, port: int, args: Any, log: Path) -> dict[str, Any]:
    r = redis.Redis(port=port)
    r.flushall()
    queue = f"eta-{uuid.uuid4().hex[:6]}"
    env = kb.bench_env(scheme, port, queue, acks_late=False)
    kb.configure(env)
    worker = kb.start_worker(env, "prefork", log)
    try:
        time.sleep(3)
        out: dict[str, Any] = {"none_waiting": measure(r, queue, worker, args, scheme)}
        t0 = time.perf_counter()
        for _ in range(args.eta_n):
            kb.noop.apply_async(countdown=COUNTDOWN_S)
        out["eta_publish_s"] = time.perf_counter() - t0
        deadline = time.monotonic() + 600
        while not waiting_taken(scheme, r, queue, args.eta_n):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"the {scheme} worker did not take the ETA tasks; see {log}")
            time.sleep(0.5)
        out["taken_s"] = time.perf_counter() - t0
        out["eta_waiting"] = measure(r, queue, worker, args, scheme)
        restart_at = time.perf_counter()
        kb.stop(worker)
        worker = kb.start_worker(env, "prefork", log)
        key = f"restart:{queue}"
        results = redis.Redis(port=port, db=1)
        kb.stamp.delay(key, time.time())
        while results.llen(key) < 1:
            if time.perf_counter() - restart_at > 900:
                raise RuntimeError(f"nothing ran after the {scheme} restart; see {log}")
            time.sleep(0.05)
        out["restart_s"] = time.perf_counter() - restart_at
    finally:
        kb.stop(worker)
    return out


def run(port: int, args: Any, log: Path) -> dict[str, Any]:
    print(f"ETA: {args.eta_n:,} countdown tasks ({COUNTDOWN_S:.0f} s) waiting; burst of "
          f"{args.eta_burst:,} immediate noops; {args.eta_stream} paced at {args.eta_rate:.0f}/s")
    res = {s: one_transport(s, port, args, log) for s in ("redis", "belayq")}
    rows = [("immediate throughput, tasks/s", "throughput", "{:,.0f}"),
            ("immediate latency p50, ms", "p50_ms", "{:,.1f}"),
            ("immediate latency p99, ms", "p99_ms", "{:,.1f}"),
            ("worker RSS, MB", "rss_mb", "{:,.0f}"),
            ("Redis server time while idle, ms/s", "idle_server_ms_per_s", "{:,.2f}"),
            ("publish replies trimmed after, s", "replies_trimmed_s", "{:,.1f}")]
    print(f"{'':38} {'redis:// none':>14} {'with ETAs':>12} {'belayq:// none':>15} "
          f"{'with ETAs':>12} {'belayq with/none':>17} {'belayq/stock with':>18}")
    for label, key, fmt in rows:
        s0, s1 = res["redis"]["none_waiting"][key], res["redis"]["eta_waiting"][key]
        b0, b1 = res["belayq"]["none_waiting"][key], res["belayq"]["eta_waiting"][key]
        print(f"{label:38} {fmt.format(s0):>14} {fmt.format(s1):>12} {fmt.format(b0):>15} "
              f"{fmt.format(b1):>12} {b1 / b0 if b0 else float('nan'):>16.2f}x "
              f"{b1 / s1 if s1 else float('nan'):>17.2f}x")
    for label, key in (("publishing the ETA tasks, s", "eta_publish_s"),
                       ("until the worker took them, s", "taken_s"),
                       ("worker restart to a task run, s", "restart_s")):
        s, b = res["redis"][key], res["belayq"][key]
        print(f"{label:38} {s:>14.1f} {'':>12} {b:>15.1f} {'':>12} {'':>17} {b / s:>17.2f}x")
    res["summary"] = {
        "belayq_throughput_with_over_none": res["belayq"]["eta_waiting"]["throughput"]
        / res["belayq"]["none_waiting"]["throughput"],
        "belayq_rss_growth_mb": res["belayq"]["eta_waiting"]["rss_mb"]
        - res["belayq"]["none_waiting"]["rss_mb"],
        "stock_rss_growth_mb": res["redis"]["eta_waiting"]["rss_mb"]
        - res["redis"]["none_waiting"]["rss_mb"],
        "belayq_idle_server_with_over_none": res["belayq"]["eta_waiting"]["idle_server_ms_per_s"]
        / res["belayq"]["none_waiting"]["idle_server_ms_per_s"],
        "median_latency_ms": med([res[s]["eta_waiting"]["p50_ms"] for s in res]),
    }
    print(json.dumps(res["summary"]))
    return res


# -- ETA accuracy ----------------------------------------------------------------------------


def accuracy_round(scheme: str, port: int, args: Any, log: Path) -> dict[str, Any]:
    """``--accuracy-n`` tasks with ETAs spread over ``--accuracy-spread`` s, two workers;
    half-way through, one worker (its whole process group) is killed with SIGKILL and a new
    one started. Each task notes when it started; lateness = start - ETA."""
    import random
    import signal
    from datetime import datetime, timezone

    r = redis.Redis(port=port)
    r.flushall()
    queue = f"acc-{uuid.uuid4().hex[:6]}"
    env = kb.bench_env(scheme, port, queue, acks_late=True)
    kb.configure(env)
    workers = [kb.start_worker(env, "prefork", log) for _ in range(2)]
    key = f"acc:{queue}"
    results = redis.Redis(port=port, db=1)
    try:
        time.sleep(4)
        rng = random.Random(7)
        start = time.time() + 5
        etas = sorted(start + rng.uniform(0, args.accuracy_spread)
                      for _ in range(args.accuracy_n))
        for i, eta in enumerate(etas):
            when = datetime.fromtimestamp(eta, timezone.utc)
            kb.eta_probe.apply_async((key, i, eta), eta=when)
        time.sleep(max(0.0, start + args.accuracy_spread / 2 - time.time()))
        os.killpg(workers[0].pid, signal.SIGKILL)
        workers[0].wait()
        killed_at = time.time()
        workers[0] = kb.start_worker(env, "prefork", log)
        deadline = start + args.accuracy_spread + args.accuracy_window
        while results.llen(key) < args.accuracy_n and time.time() < deadline:
            time.sleep(0.5)
        runs = [json.loads(x) for x in results.lrange(key, 0, -1)]
    finally:
        for w in workers:
            kb.stop(w)
    late = {}
    for run in runs:  # a task that ran twice counts its first start
        late.setdefault(run["i"], run["late"])
    values = list(late.values())
    return {
        "tasks": args.accuracy_n,
        "ran": len(late),
        "ran_twice": len(runs) - len(late),
        "missing": args.accuracy_n - len(late),
        "late_over_1s": sum(v > 1.0 for v in values),
        "p50_ms": percentile(values, 0.5) * 1000,
        "p99_ms": percentile(values, 0.99) * 1000,
        "max_ms": max(values) * 1000 if values else float("nan"),
        "early_ms": min(values) * 1000 if values else float("nan"),
        "killed_at_s": killed_at - start,
    }


def accuracy(port: int, args: Any, log: Path) -> dict[str, Any]:
    print(f"ETA accuracy: {args.accuracy_n} tasks due over {args.accuracy_spread:.0f} s, 2 "
          f"workers (prefork -c 2, acks_late); one killed -9 and replaced half-way; "
          f"{args.accuracy_window:.0f} s allowed after the last ETA")
    res = {s: accuracy_round(s, port, args, log) for s in ("redis", "belayq")}
    print(f"{'':8} {'ran':>5} {'missing':>8} {'twice':>6} {'late>1s':>8} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'max ms':>9} {'earliest ms':>12}")
    for scheme, x in res.items():
        print(f"{scheme:8} {x['ran']:>5} {x['missing']:>8} {x['ran_twice']:>6} "
              f"{x['late_over_1s']:>8} {x['p50_ms']:>8.0f} {x['p99_ms']:>8.0f} "
              f"{x['max_ms']:>9.0f} {x['early_ms']:>12.0f}")
    return res
