"""The stock ``redis://`` kombu transport vs ``belayq://``, side by side, in one run.

Run from the repository root::

    .venv/bin/python -m benchmarks.kombu_bench [--n 5000] [--celery-n 5000] [--reps 3]
        [--only kombu,celery,drain,recovery] [--recovery-window 150] [--json out.json]
    .venv/bin/python -m benchmarks.kombu_bench --only eta,eta_accuracy   (kombu_eta.py)

What it measures (medians over ``--reps``, the two transports interleaved rep by rep, on
one private redis-server started here on a free port, never 6379):

* kombu ``Producer.publish`` to a named direct exchange (as in the baseline survey), and
  ``Consumer`` + ``drain_events`` + ``message.ack()`` with prefetch 1 and 100;
* Celery ``noop.delay()`` (ignore_result, no result backend);
* Celery worker drain of ``--celery-n`` queued noops: ``celery worker`` subprocesses,
  ``--pool=solo`` and ``--pool=prefork -c 2``, ``task_acks_late`` off and on; timed from
  the first message leaving the queue to the last one acked (start-up excluded);
* recovery after ``kill -9``: worker 1 (prefork -c 2, acks_late) holds 4 tasks of 20 s
  (2 running, 2 prefetched), worker 2 idles; worker 1's process group is SIGKILLed and the
  time until worker 2 starts them is measured, up to ``--recovery-window`` seconds. The
  stock transport runs with its defaults (visibility_timeout 3600 s) and, to show its
  mechanism, with visibility_timeout=10; belayq with its defaults (lease 20 s).

Ratios are belayq / stock (for recovery: stock / belayq, so > 1 means belayq is faster).
The box is shared and has 2 cores: client, worker and redis-server compete; compare
ratios, not absolute numbers, and look at the min-max spread.

This file is also the Celery app the worker subprocesses run (``celery -A kombu_bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq://)
from benchmarks.stats import med

HERE = Path(__file__).resolve().parent
TRACE = bool(os.environ.get("BENCH_TRACE"))
ROOT = HERE.parent

# -- the Celery app the worker subprocesses run ---------------------------------------------

app = Celery("kombu_bench", broker=os.environ.get("BENCH_BROKER", "memory://"))
app.conf.update(
    task_acks_late=os.environ.get("BENCH_ACKS_LATE") == "1",
    task_reject_on_worker_lost=True,
    task_default_queue=os.environ.get("BENCH_QUEUE", "celery"),
    broker_transport_options=json.loads(os.environ.get("BENCH_OPTIONS", "{}")),
    worker_hijack_root_logger=False,
)


@app.task(name="kombu_bench.noop", ignore_result=True)
def noop() -> None:
    pass


@app.task(name="kombu_bench.stamp", ignore_result=True)
def stamp(key: str, sent: float) -> None:
    """An immediate task that notes how long after its publish it started (kombu_eta)."""
    r = redis.Redis.from_url(os.environ["BENCH_REDIS"])
    r.rpush(key, time.time() - sent)


@app.task(name="kombu_bench.eta_probe", ignore_result=True)
def eta_probe(key: str, i: int, eta: float) -> None:
    """A task with an ETA that notes how late it started (kombu_eta's accuracy run)."""
    r = redis.Redis.from_url(os.environ["BENCH_REDIS"])
    r.rpush(key, json.dumps({"i": i, "late": time.time() - eta, "pid": os.getpid()}))


@app.task(name="kombu_bench.sleeper", ignore_result=True)
def sleeper(key: str, i: int, seconds: float) -> None:
    r = redis.Redis.from_url(os.environ["BENCH_REDIS"])
    r.rpush(key, json.dumps({"i": i, "t": time.time(), "pid": os.getpid()}))
    time.sleep(seconds)


# -- helpers ------------------------------------------------------------------------------


def url(scheme: str, port: int) -> str:
    return f"{scheme}://127.0.0.1:{port}/0"


def summary(values: list[float]) -> dict[str, float]:
    return {"median": med(values), "min": min(values), "max": max(values)}


def in_flight(scheme: str, port: int, queue: str) -> int:
    """Messages taken but not acked: stock's unacked hash, or belayq's in-flight count."""
    r = redis.Redis(port=port)
    if scheme == "redis":
        return int(r.hlen("unacked"))
    import kombu

    with kombu.Connection(url("belayq", port)) as conn:
        return int(conn.default_channel.queue(queue).stats()["in_flight"])


# -- kombu --------------------------------------------------------------------------------


def kombu_round(scheme: str, port: int, n: int, prefetch: int) -> tuple[float, float]:
    """(publish msg/s, consume+ack msg/s) for one fresh queue."""
    import kombu

    name = f"kb-{uuid.uuid4().hex[:8]}"
    ex = kombu.Exchange(name, type="direct")
    q = kombu.Queue(name, ex, routing_key=name)
    with kombu.Connection(url(scheme, port)) as conn:
        producer = conn.Producer()
        producer.publish({"i": -1}, exchange=ex, routing_key=name, declare=[q])
        t0 = time.perf_counter()
        for i in range(n):
            producer.publish({"i": i}, exchange=ex, routing_key=name)
        publish = n / (time.perf_counter() - t0)
        got = [0]

        def on_message(body: Any, message: Any) -> None:
            got[0] += 1
            message.ack()

        with kombu.Consumer(conn, [q], callbacks=[on_message], prefetch_count=prefetch):
            t0 = time.perf_counter()
            while got[0] < n + 1:
                conn.drain_events(timeout=10)
            consume = n / (time.perf_counter() - t0)
    r = redis.Redis(port=port)
    assert r.llen(name) == 0 and in_flight(scheme, port, name) == 0
    return publish, consume


# -- Celery -------------------------------------------------------------------------------


def bench_env(scheme: str, port: int, queue: str, acks_late: bool,
              options: dict[str, Any] | None = None) -> dict[str, str]:
    return dict(
        os.environ,
        BENCH_BROKER=url(scheme, port),
        BENCH_REDIS=f"redis://127.0.0.1:{port}/1",
        BENCH_QUEUE=queue,
        BENCH_ACKS_LATE="1" if acks_late else "0",
        BENCH_OPTIONS=json.dumps(options or {}),
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )


def configure(env: dict[str, str]) -> None:
    app.conf.broker_url = env["BENCH_BROKER"]
    app.conf.task_default_queue = env["BENCH_QUEUE"]
    app.conf.broker_transport_options = json.loads(env["BENCH_OPTIONS"])
    app._pool = None  # connections and producers for the new broker URL
    app.amqp._producer_pool = None


def start_worker(env: dict[str, str], pool: str, log: Path) -> subprocess.Popen[bytes]:
    args = ["--pool=solo"] if pool == "solo" else ["--pool=prefork", "-c", "2"]
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "kombu_bench", "worker", *args, "-l", "warning",
         "-n", f"bench-{uuid.uuid4().hex[:6]}@%h"],
        cwd=HERE, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def celery_round(scheme: str, port: int, n: int, pool: str, acks_late: bool,
                 log: Path) -> tuple[float, float]:
    """(delay() tasks/s, worker drain tasks/s) for ``n`` noops on a fresh queue."""
    queue = f"cb-{uuid.uuid4().hex[:8]}"
    env = bench_env(scheme, port, queue, acks_late)
    configure(env)
    r = redis.Redis(port=port)
    noop.delay()
    r.delete(queue)
    t0 = time.perf_counter()
    for _ in range(n):
        noop.delay()
    enqueue = n / (time.perf_counter() - t0)
    assert r.llen(queue) == n
    worker = start_worker(env, pool, log)
    try:
        while r.llen(queue) >= n:
            if worker.poll() is not None:
                raise RuntimeError(f"worker exited; see {log}")
            time.sleep(0.002)
        started = time.perf_counter()
        while r.llen(queue) > 0:
            if TRACE:
                print(f"  {scheme} {time.perf_counter() - started:6.2f} s ready {r.llen(queue)}")
            time.sleep(0.01)
        while in_flight(scheme, port, queue) > 0:
            time.sleep(0.01)
        drain = n / (time.perf_counter() - started)
    finally:
        stop(worker)
    return enqueue, drain


def recovery_round(scheme: str, port: int, options: dict[str, Any], window: float,
                   log: Path) -> float | None:
    """Seconds from kill -9 of worker 1 until idle worker 2 starts its first orphaned task;
    None when nothing came back within ``window``."""
    queue = f"rc-{uuid.uuid4().hex[:8]}"
    env = bench_env(scheme, port, queue, True, options)
    configure(env)
    r = redis.Redis(port=port, db=1)
    key = f"starts:{queue}"
    w1 = start_worker(env, "prefork", log)
    w2 = None
    try:
        for i in range(4):
            sleeper.delay(key, i, 20.0)
        deadline = time.monotonic() + 60
        while r.llen(key) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker 1 did not start tasks; see {log}")
            time.sleep(0.05)
        w2 = start_worker(env, "prefork", log)
        time.sleep(6)  # worker 2 is up and idle (worker 1 prefetched everything)
        os.killpg(w1.pid, signal.SIGKILL)
        w1.wait()
        killed = time.time()
        before = r.llen(key)
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            if r.llen(key) > before:
                first = json.loads(r.lindex(key, before))
                return float(first["t"] - killed)
            time.sleep(0.1)
        return None
    finally:
        stop(w1)
        if w2 is not None:
            os.killpg(w2.pid, signal.SIGKILL)
            w2.wait()


# -- running and reporting ------------------------------------------------------------------


def interleave(reps: int, fn: Callable[[str], Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"redis": [], "belayq": []}
    for _ in range(reps):
        for scheme in ("redis", "belayq"):
            out[scheme].append(fn(scheme))
    return out


def line(label: str, stock: list[float], ours: list[float], unit: str) -> dict[str, Any]:
    s, b = summary(stock), summary(ours)
    ratio = b["median"] / s["median"]
    print(f"{label:42} {s['median']:8.0f} ({s['min']:.0f}-{s['max']:.0f})  "
          f"{b['median']:8.0f} ({b['min']:.0f}-{b['max']:.0f})  {ratio:5.2f}x  {unit}")
    return {"stock": s, "belayq": b, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=5000, help="messages per kombu round")
    ap.add_argument("--celery-n", type=int, default=5000, help="tasks per Celery round")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="kombu,celery,drain,recovery")
    ap.add_argument("--recovery-window", type=float, default=150.0)
    ap.add_argument("--eta-n", type=int, default=100_000, help="waiting countdown tasks (eta)")
    ap.add_argument("--eta-burst", type=int, default=3000, help="immediate tasks drained (eta)")
    ap.add_argument("--eta-stream", type=int, default=600, help="paced immediate tasks (eta)")
    ap.add_argument("--eta-rate", type=float, default=100.0, help="their rate per s (eta)")
    ap.add_argument("--eta-idle", type=float, default=10.0, help="idle window, s (eta)")
    ap.add_argument("--accuracy-n", type=int, default=1000, help="ETA tasks (eta_accuracy)")
    ap.add_argument("--accuracy-spread", type=float, default=60.0, help="their ETAs span, s")
    ap.add_argument("--accuracy-window", type=float, default=60.0,
                    help="time allowed after the last ETA, s")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    from belayq.embedded import RedisServer

    results: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(),
                               "n": args.n, "celery_n": args.celery_n, "reps": args.reps}
    log = Path(os.environ.get("BENCH_LOG", "/tmp/kombu_bench_workers.log"))
    with RedisServer() as server:
        port = server.port
        print(f"redis-server {server.binary} on port {port}; {args.reps} reps, medians "
              f"(min-max); worker logs in {log}")
        print(f"{'':42} {'redis://':>20}  {'belayq://':>20}  ratio")
        if "kombu" in only:
            for prefetch in (1, 100):
                rounds = interleave(
                    args.reps, lambda s, p=prefetch: kombu_round(s, port, args.n, p))
                if prefetch == 1:
                    results["kombu_publish"] = line(
                        "kombu publish (named direct exchange)",
                        [x[0] for x in rounds["redis"]], [x[0] for x in rounds["belayq"]], "msg/s")
                results[f"kombu_consume_ack_prefetch_{prefetch}"] = line(
                    f"kombu consume+ack, prefetch {prefetch}",
                    [x[1] for x in rounds["redis"]], [x[1] for x in rounds["belayq"]], "msg/s")
        if "celery" in only or "drain" in only:
            combos = [("solo", False), ("solo", True), ("prefork", False), ("prefork", True)]
            if "drain" not in only:
                combos = combos[:1]
            delays: dict[str, list[float]] = {"redis": [], "belayq": []}
            for pool, late in combos:
                rounds = interleave(
                    args.reps,
                    lambda s, p=pool, a=late: celery_round(s, port, args.celery_n, p, a, log))
                for s in delays:
                    delays[s] += [x[0] for x in rounds[s]]
                if "drain" in only:
                    label = f"Celery drain, {pool}{' -c 2' if pool == 'prefork' else ''}, " \
                            f"acks_late={'on' if late else 'off'}"
                    results[f"celery_drain_{pool}_acks_late_{late}"] = line(
                        label, [x[1] for x in rounds["redis"]], [x[1] for x in rounds["belayq"]],
                        "tasks/s")
            results["celery_delay"] = line("Celery noop.delay()", delays["redis"],
                                           delays["belayq"], "tasks/s")
        if "recovery" in only:
            print(f"recovery after kill -9 of a worker holding 4 acks_late tasks (window "
                  f"{args.recovery_window:.0f} s; idle second worker):")
            cases = [("redis", {}, "redis:// defaults (visibility_timeout 3600 s)"),
                     ("redis", {"visibility_timeout": 10}, "redis://, visibility_timeout=10"),
                     ("belayq", {}, "belayq:// defaults (lease 20 s, sweep 1 s)"),
                     ("belayq", {"visibility_timeout": 5}, "belayq://, visibility_timeout=5")]
            rec: dict[str, Any] = {}
            for scheme, options, label in cases:
                took = recovery_round(scheme, port, options, args.recovery_window, log)
                shown = f"{took:.1f} s" if took is not None else \
                    f"not back within {args.recovery_window:.0f} s"
                print(f"  {label:48} {shown}")
                rec[label] = took
            stock, ours = rec[cases[0][2]], rec[cases[2][2]]
            stock_s = stock if stock is not None else args.recovery_window
            if ours:
                print(f"  ratio stock/belayq at defaults: > {stock_s / ours:.1f}x"
                      if stock is None else f"  ratio stock/belayq at defaults: "
                      f"{stock_s / ours:.1f}x")
            results["recovery_s"] = rec
        if "eta" in only:
            from benchmarks import kombu_eta

            results["eta"] = kombu_eta.run(port, args, log)
        if "eta_accuracy" in only:
            from benchmarks import kombu_eta

            results["eta_accuracy"] = kombu_eta.accuracy(port, args, log)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
