"""Stock RQ vs belayq_rq, side by side on one private redis-server, in one run.

Run from the repository root::

    .venv/bin/python -m benchmarks.rq_bench [--n 5000] [--n-fork 500] [--reps 3] [--json out]

What it measures (medians over ``--reps``, stock and belayq alternating in every rep, with
min-max), reported as belayq/stock ratios (target >= 1.0x):

* ``enqueue``: N x ``Queue.enqueue(noop)`` (``rq.Queue`` vs ``belayq_rq.Queue``; producers
  are the same code, so this checks that nothing was added to them);
  the drained jobs are ``time.sleep(0)``: a function the worker has imported already, so a
  work horse pays no import and the queue's own costs show;
* ``enqueue_many``: N prepared jobs in one ``enqueue_many``;
* drain, ``SimpleWorker``: ``rq worker --burst -w rq.worker.SimpleWorker`` vs
  ``-w belayq_rq.SimpleWorker`` on N queued jobs; one queue, and two queues with every job
  on the second (the worst case of the priority claim);
* drain, forking ``Worker``: the same with ``--n-fork`` jobs;
  a drain's rate is jobs / (last ``ended_at`` - first ``started_at``), as in the baseline;
* recovery after ``kill -9``: a worker runs a 2 s job; the worker and its work horse are
  SIGKILLed; a second worker is already idle on the queue. belayq (default 20 s lease):
  the time until the job runs again. Stock: watched for ``--stock-window`` s, in which it
  never runs again (stock RQ fails it as AbandonedJobError at its next maintenance pass,
  ~10 min later; baseline §7.2 measured +812 s).

The server is started here (``belayq.embedded.RedisServer``, a free port, never 6379) and
stopped at the end. Other load on this shared 2-core box moves the numbers; compare the
ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
import rq
from rq.job import Job

import belayq_rq
from belayq.embedded import RedisServer
from benchmarks.stats import med, spread

ROOT = Path(__file__).resolve().parent.parent
RQ_BIN = str(Path(sys.executable).with_name("rq"))
STOCK = {"queue": rq.Queue, "simple": "rq.worker.SimpleWorker", "fork": "rq.worker.Worker"}
BELAYQ = {"queue": belayq_rq.Queue, "simple": "belayq_rq.SimpleWorker", "fork": "belayq_rq.Worker"}


def noop() -> None:
    return None


def sleeper(seconds: float) -> None:
    job = rq.get_current_job()
    assert job is not None
    job.connection.rpush(f"bench:runs:{job.id}", f"{os.getpid()} {time.time():.6f}")
    time.sleep(seconds)


def _job(name: str) -> Any:
    """A job function by its importable name (this file may run as ``__main__``)."""
    import importlib

    return getattr(importlib.import_module("benchmarks.rq_bench"), name)


def _env() -> dict[str, str]:
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _worker(url: str, cls: str, queues: list[str], burst: bool) -> subprocess.Popen[bytes]:
    cmd = [RQ_BIN, "worker", "-u", url, "-w", cls, "--logging_level", "WARNING",
           *(["--burst"] if burst else []), *queues]
    return subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def enqueue_rate(conn: redis.Redis, queue_class: Any, n: int) -> float:
    conn.flushall()
    q = queue_class("bench", connection=conn)
    q.enqueue(_job("noop"))  # warm: server version cached on the connection
    conn.flushall()
    t0 = time.perf_counter()
    fn = _job("noop")
    for _ in range(n):
        q.enqueue(fn)
    return n / (time.perf_counter() - t0)


def enqueue_many_rate(conn: redis.Redis, queue_class: Any, n: int) -> float:
    conn.flushall()
    q = queue_class("bench", connection=conn)
    data = [queue_class.prepare_data(_job("noop")) for _ in range(n)]
    t0 = time.perf_counter()
    q.enqueue_many(data)
    return n / (time.perf_counter() - t0)


def drain_rate(conn: redis.Redis, url: str, worker: str, n: int, queues: list[str]) -> float:
    conn.flushall()
    q = rq.Queue(queues[-1], connection=conn)
    data = [rq.Queue.prepare_data("time.sleep", (0,)) for _ in range(n)]
    ids = [j.id for j in q.enqueue_many(data)]
    proc = _worker(url, worker, queues, burst=True)
    if proc.wait(600) != 0:
        raise SystemExit(f"{worker} exited with {proc.returncode}")
    jobs = Job.fetch_many(ids, connection=conn)
    if any(j is None or j.get_status(refresh=False) != "finished" for j in jobs):
        raise SystemExit(f"{worker}: not every job finished")
    start = min(j.started_at for j in jobs if j and j.started_at)
    end = max(j.ended_at for j in jobs if j and j.ended_at)
    return n / (end - start).total_seconds()


def recovery(conn: redis.Redis, url: str, worker: str, window: float) -> float | None:
    """Seconds from kill -9 of worker + horse until the job runs again (None: not seen)."""
    conn.flushall()
    a = _worker(url, worker, ["bench"], burst=False)
    time.sleep(1.0)
    job = rq.Queue("bench", connection=conn).enqueue(_job("sleeper"), 2.0)
    deadline = time.monotonic() + 30
    while conn.llen(f"bench:runs:{job.id}") == 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"{worker}: the job did not start")
        time.sleep(0.01)
    b = _worker(url, worker, ["bench"], burst=False)
    time.sleep(1.0)  # B is up and idle before the crash
    horse = int(conn.lindex(f"bench:runs:{job.id}", 0).split()[0])  # type: ignore[union-attr]
    for pid in (horse, a.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = time.time()
    a.wait()
    try:
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            runs = conn.lrange(f"bench:runs:{job.id}", 0, -1)
            if len(runs) >= 2:
                return float(runs[1].split()[1]) - killed
            time.sleep(0.05)
        return None
    finally:
        os.killpg(b.pid, signal.SIGKILL)
        b.wait()


def line(name: str, stock: list[float], ours: list[float], unit: str) -> str:
    ratio = med(ours) / med(stock)
    return f"| {name} | {spread(stock, ',.0f')} | {spread(ours, ',.0f')} | {ratio:.2f}x | {unit} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="jobs per enqueue/SimpleWorker run")
    ap.add_argument("--n-fork", type=int, default=500, help="jobs per forking-Worker run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--stock-window", type=float, default=60.0,
                    help="seconds to watch stock RQ for a re-run after the kill")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    args = ap.parse_args(argv)

    res: dict[str, dict[str, list[float]]] = {}

    def rec(key: str, side: str, value: float) -> None:
        res.setdefault(key, {"stock": [], "belayq": []})[side].append(value)

    with RedisServer() as server:
        conn = redis.Redis(port=server.port)
        url = server.url
        for rep in range(args.reps):
            sides = [("stock", STOCK), ("belayq", BELAYQ)]
            if rep % 2:
                sides.reverse()  # alternate who goes first: drift hits both
            for side, impl in sides:
                rec("enqueue", side, enqueue_rate(conn, impl["queue"], args.n))
                rec("enqueue_many", side, enqueue_many_rate(conn, impl["queue"], args.n))
                rec("simple_1q", side, drain_rate(conn, url, impl["simple"], args.n, ["bench"]))
                rec("simple_2q", side,
                    drain_rate(conn, url, impl["simple"], args.n, ["high", "bench"]))
                rec("fork_1q", side, drain_rate(conn, url, impl["fork"], args.n_fork, ["bench"]))
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
        ours = recovery(conn, url, BELAYQ["fork"], 60.0)
        stock = recovery(conn, url, STOCK["fork"], args.stock_window)

    rows: list[tuple[str, str, str]] = [
        ("enqueue", "Queue.enqueue", "jobs/s"),
        ("enqueue_many", "Queue.enqueue_many", "jobs/s"),
        ("simple_1q", "drain, SimpleWorker, 1 queue", "jobs/s"),
        ("simple_2q", "drain, SimpleWorker, 2 queues (jobs on the 2nd)", "jobs/s"),
        ("fork_1q", "drain, forking Worker, 1 queue", "jobs/s"),
    ]
    print(f"\nRQ {rq.__version__}, redis-py {redis.__version__}, Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs; n={args.n}, "
          f"n_fork={args.n_fork}, reps={args.reps}\n")
    print("| measure | stock rq | belayq_rq | ratio | unit |\n|---|---|---|---|---|")
    for key, name, unit in rows:
        print(line(name, res[key]["stock"], res[key]["belayq"], unit))
    stock_txt = (f"{stock:.1f} s" if stock is not None
                 else f"not re-run within {args.stock_window:.0f} s (FAILED ~10 min later)")
    ours_txt = f"{ours:.1f} s" if ours is not None else "not re-run within 60 s"
    print(f"| recovery after kill -9 (worker + horse), 2nd worker idle | {stock_txt} | "
          f"{ours_txt} (lease 20 s) | "
          f"{'n/a (stock never re-runs it)' if stock is None else f'{stock / ours:.1f}x'} | s |")
    if args.json:
        out = {"results": res, "recovery_s": {"stock": stock, "belayq": ours}, "args": vars(args)}
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

