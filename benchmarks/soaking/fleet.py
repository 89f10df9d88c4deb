"""The soak's fleet: worker processes of the three frameworks, the dashboard and the
exporter as ``belayq`` commands, and the producer of each framework. Every process runs on
127.0.0.1 against the soak's own redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from benchmarks.chaos import procs
from benchmarks.chaos.stacks import WorkerProc

ROOT = Path(__file__).resolve().parents[2]
RQ_BIN = str(Path(sys.executable).with_name("rq"))
FRAMEWORKS = ("celery", "rq", "dramatiq")
READY = {"celery": " ready.", "rq": "Listening on", "dramatiq": "ready for action"}


@dataclass(frozen=True)
class FleetConfig:
    port: int  # the broker's
    ledger_url: str
    logdir: Path
    lease_s: float
    max_deliveries: int
    workers: int  # per framework
    queues: dict[str, str]  # framework -> queue name

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def worker_env(cfg: FleetConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        PYTHONUNBUFFERED="1", SOAK_WORKER="1", SOAK_LEDGER_URL=cfg.ledger_url,
        SOAK_BROKER=f"belayq://127.0.0.1:{cfg.port}/0", SOAK_DRAMATIQ_URL=cfg.url,
        SOAK_CELERY_QUEUE=cfg.queues["celery"], SOAK_DRAMATIQ_QUEUE=cfg.queues["dramatiq"],
        SOAK_LEASE_S=str(cfg.lease_s), SOAK_MAX_DELIVERIES=str(cfg.max_deliveries),
    )
    for name in ("RQ_QUEUE_CLASS", "RQ_WORKER_CLASS", "PYTEST_CURRENT_TEST"):
        env.pop(name, None)
    return env


def worker_cmd(framework: str, name: str, cfg: FleetConfig) -> list[str]:
    q = cfg.queues[framework]
    if framework == "celery":
        return [sys.executable, "-m", "celery", "-A", "benchmarks.soaking.celery_app", "worker",
                "-P", "prefork", "-c", "2", "-n", f"{name}@%h", "-Q", q, "-l", "info",
                "--without-mingle", "--without-gossip"]
    if framework == "rq":
        return [RQ_BIN, "worker", "-u", cfg.url, "-w", "benchmarks.soaking.rq_app.SoakWorker",
                "-n", name, "--with-scheduler", "--maintenance-interval", "10",
                "--worker-ttl", "40", "--logging_level", "INFO", q]
    return [sys.executable, "-m", "dramatiq", "benchmarks.soaking.dramatiq_app",
            "--processes", "1", "--threads", "2", "--queues", q]


class Fleet:
    """The worker processes: started, replaced when they die, stopped at the end."""

    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        self.env = worker_env(cfg)
        self.live: dict[str, list[WorkerProc]] = {f: [] for f in FRAMEWORKS}
        self.started: list[WorkerProc] = []
        self.replaced = 0

    def start(self, framework: str) -> WorkerProc:
        name = f"soakw-{framework}-{len(self.started)}-{uuid.uuid4().hex[:4]}"
        w = WorkerProc(name, worker_cmd(framework, name, self.cfg), self.env,
                       self.cfg.logdir / f"{name}.log")
        self.live[framework].append(w)
        self.started.append(w)
        return w

    def start_all(self, timeout_s: float = 180) -> None:
        for f in FRAMEWORKS:
            for _ in range(self.cfg.workers):
                self.start(f)
        deadline = time.monotonic() + timeout_s
        for f in FRAMEWORKS:
            for w in self.live[f]:
                while READY[f] not in w.text():
                    if w.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{w.name} did not start:\n{w.text()[-3000:]}")
                    time.sleep(0.2)

    def replace_dead(self) -> int:
        """Start a worker for each one whose main process ended; how many."""
        n = 0
        for f, workers in self.live.items():
            for w in [w for w in workers if w.proc.poll() is not None]:
                workers.remove(w)
                self.start(f)
                n += 1
        self.replaced += n
        return n

    def kill(self, rng: Any) -> dict[str, Any] | None:
        """SIGKILL, at random, a whole worker (its main process and every child) or one
        child that runs tasks (a pool child, a work horse, a Dramatiq worker process)."""
        workers = [(f, w) for f, ws in self.live.items() for w in ws if w.proc.poll() is None]
        if not workers:
            return None
        framework, w = rng.choice(workers)
        tree = w.tree()
        children = tree[1:]
        if children and rng.random() < 0.5:
            pids, what = [rng.choice(children)], "child"
        else:
            pids, what = tree, "worker"
        hit = procs.signal_pids(pids, signal.SIGKILL)
        return {"t": time.time(), "framework": framework, "worker": w.name, "what": what,
                "pids": hit}

    def stop(self, grace_s: float = 30) -> list[str]:
        """SIGTERM every live worker (a warm shutdown: each unregisters), SIGKILL those not
        gone after ``grace_s``; the names of those killed."""
        alive = [w for w in self.started if w.proc.poll() is None]
        for w in alive:
            procs.signal_pids([w.pid], signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        killed = []
        for w in alive:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(w.name)
        for w in self.started:  # what is left of any tree (orphans included) goes too
            pids = [p for p in w.tree() if procs.alive(p)] if w.proc.poll() is None else []
            procs.signal_pids(pids, signal.SIGKILL)
        for w in self.started:
            if w.proc.poll() is None:
                w.proc.wait(10)
        return killed


class Tool:
    """``belayq dashboard`` or ``belayq exporter`` on a free port of 127.0.0.1."""

    def __init__(self, command: str, url: str, port: int, logdir: Path) -> None:
        self.command, self.port = command, port
        self.log = logdir / f"{command}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "belayq", command, "--url", url, "--host", "127.0.0.1",
                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, path: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                get(self.base() + path)
                return
            except (OSError, urllib.error.URLError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"belayq {self.command} did not start:\n"
                                       f"{self.log.read_text(errors='replace')[-2000:]}") from None
                time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def get(url: str, timeout_s: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return bytes(reply.read())


def post(url: str, body: dict[str, Any], timeout_s: float = 60) -> bytes:
    import json

    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return bytes(reply.read())


class Producers:
    """The soak process's producers, one per framework (traced: the soak instruments
    itself before it makes them)."""

    def __init__(self, cfg: FleetConfig) -> None:
        from .celery_app import make_app
        from .dramatiq_app import make_broker
        from .rq_app import SoakQueue

        self.cfg = cfg
        self.celery = make_app(f"belayq://127.0.0.1:{cfg.port}/0", cfg.queues["celery"],
                               cfg.lease_s, cfg.max_deliveries)
        self.rq_conn = redis.Redis(host="127.0.0.1", port=cfg.port)
        self.rq = SoakQueue(cfg.queues["rq"], connection=self.rq_conn)
        self.dramatiq = make_broker(cfg.url)
        self.dramatiq.declare_queue(cfg.queues["dramatiq"])

    def send(self, framework: str, task_id: str, plan: str, seconds: float,
             delay_s: float) -> None:
        if framework == "celery":
            from .celery_app import TASK_NAME

            self.celery.send_task(TASK_NAME, args=[task_id, plan, seconds], task_id=task_id,
                                  countdown=delay_s or None)
        elif framework == "rq":
            from rq import Retry

            opts: dict[str, Any] = {"job_id": task_id}
            if plan.startswith("retry:"):
                opts["retry"] = Retry(max=int(plan.split(":", 1)[1]), interval=1)
            func = "benchmarks.soaking.rq_app.work"
            if delay_s:
                self.rq.enqueue_in(timedelta(seconds=delay_s), func, task_id, plan, seconds,
                                   **opts)
            else:
                self.rq.enqueue(func, task_id, plan, seconds, **opts)
        else:
            from .dramatiq_app import message

            self.dramatiq.enqueue(message(self.cfg.queues["dramatiq"], task_id, plan, seconds),
                                  delay=round(delay_s * 1000) if delay_s else None)

    def close(self) -> None:
        self.celery.close()
        self.dramatiq.close()
        self.rq_conn.close()
