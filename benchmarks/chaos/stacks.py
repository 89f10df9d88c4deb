"""The four stacks under test: how to start a worker, publish a task and read the queue's
counters. Workers are real subprocesses (``celery ... worker -P prefork``, ``rq worker``
with the forking Worker), each in its own session so the harness can find its tree."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from . import procs

ROOT = Path(__file__).resolve().parents[2]
RQ_BIN = str(Path(sys.executable).with_name("rq"))
STACKS = ("celery-belayq", "rq-belayq", "celery-stock", "rq-stock")
# RQ's scheduler (for enqueue_in) runs in one worker, under a lock that lives 61 s past
# its holder's death; another worker takes it over at its next maintenance pass (default
# every 600 s), which an idle worker runs only when its blocking dequeue times out
# (worker_ttl - 15 s, default 405 s). Both RQ stacks run with maintenance every 10 s and a
# 40 s worker TTL, so delayed jobs resume within about 61 + 25 s of a scheduler's death.
RQ_MAINTENANCE_S = 10
RQ_WORKER_TTL_S = 40
HARNESS_CLIENT = "chaos-harness"  # client-name prefix of the harness's own connections


@dataclass
class StackConfig:
    """What one stack runs with (the same for every stack of a comparison)."""

    broker_port: int
    ledger_url: str
    run: str
    logdir: Path
    lease_s: float
    sweep_s: float
    max_deliveries: int
    workers: int
    concurrency: int
    long_task_s: float
    queue: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:8]}")


class WorkerProc:
    """One worker subprocess (its main process) and its log."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.started = time.time()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[int]:
        """The main process and every descendant (pool children, work horses, scheduler)."""
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(procs.children(pid))
        return out

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Stack:
    """Base class: one framework + one transport."""

    name = ""
    framework = ""
    belayq = False
    ready_marker = ""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.started: list[WorkerProc] = []

    @property
    def broker_url(self) -> str:
        return f"redis://127.0.0.1:{self.cfg.broker_port}/0"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env.update(
            PYTHONPATH=os.pathsep.join(paths),
            PYTHONUNBUFFERED="1",
            CHAOS_LEDGER_URL=self.cfg.ledger_url,
            CHAOS_RUN=self.cfg.run,
            CHAOS_QUEUE=self.cfg.queue,
            CHAOS_LEASE_S=str(self.cfg.lease_s),
            CHAOS_LEASE_MS=str(round(self.cfg.lease_s * 1000)),
            CHAOS_SWEEP_S=str(self.cfg.sweep_s),
            CHAOS_SWEEP_MS=str(round(self.cfg.sweep_s * 1000)),
            CHAOS_MAX_DELIVERIES=str(self.cfg.max_deliveries),
        )
        for name in ("RQ_QUEUE_CLASS", "RQ_WORKER_CLASS", "PYTEST_CURRENT_TEST"):
            env.pop(name, None)
        return env

    def worker_cmd(self, name: str) -> list[str]:
        raise NotImplementedError

    def start_worker(self) -> WorkerProc:
        n = len(self.started)
        name = f"{self.name}-w{n}-{uuid.uuid4().hex[:6]}"
        w = WorkerProc(name, self.worker_cmd(name), self.env(), self.cfg.logdir / f"{name}.log")
        self.started.append(w)
        return w

    def wait_ready(self, workers: list[WorkerProc], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in workers:
            while self.ready_marker not in w.text():
                if w.proc.poll() is not None:
                    raise RuntimeError(f"{w.name} exited at start:\n{w.text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{w.name} not ready in {timeout} s:\n{w.text()[-3000:]}")
                time.sleep(0.1)

    def publish(self, task_id: str, seconds: float, delay_s: float) -> None:
        raise NotImplementedError

    def core_stats(self) -> dict[str, Any] | None:
        """The belayq core's counters of the queue (None for a stock stack)."""
        return None

    def extra_stats(self) -> dict[str, Any]:
        return {}

    def waiting_ids(self) -> dict[str, list[str]]:
        """Ids the framework still keeps apart at the end (RQ: scheduled, failed)."""
        return {}

    def close(self) -> None:
        pass


class CeleryStack(Stack):
    framework = "celery"
    ready_marker = " ready."

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__(cfg)
        from .celery_app import make_app

        self.app = make_app(
            self.celery_broker, cfg.queue, cfg.lease_s, cfg.sweep_s, cfg.max_deliveries
        )
        opts = dict(self.app.conf.broker_transport_options)
        opts["client_name"] = f"{HARNESS_CLIENT}-producer"
        self.app.conf.broker_transport_options = opts

    @property
    def celery_broker(self) -> str:
        return self.broker_url

    def env(self) -> dict[str, str]:
        return {**super().env(), "CHAOS_BROKER": self.celery_broker}

    def worker_cmd(self, name: str) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "benchmarks.chaos.celery_app", "worker",
            "-P", "prefork", "-c", str(self.cfg.concurrency), "-n", f"{name}@%h",
            "-Q", self.cfg.queue, "-l", "info", "--without-mingle", "--without-gossip",
        ]  # fmt: skip

    def publish(self, task_id: str, seconds: float, delay_s: float) -> None:
        from .celery_app import TASK_NAME

        self.app.send_task(
            TASK_NAME, args=[task_id, seconds], task_id=task_id,
            countdown=delay_s if delay_s > 0 else None,
        )  # fmt: skip

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.app.close()


class CeleryBelayq(CeleryStack):
    name = "celery-belayq"
    belayq = True

    @property
    def celery_broker(self) -> str:
        return f"belayq://127.0.0.1:{self.cfg.broker_port}/0"

    def core_stats(self) -> dict[str, Any] | None:
        from kombu.connection import Connection

        from .celery_app import transport_options

        opts = transport_options(
            self.celery_broker, self.cfg.lease_s, self.cfg.sweep_s, self.cfg.max_deliveries
        )
        opts["client_name"] = f"{HARNESS_CLIENT}-stats"
        with Connection(self.celery_broker, transport_options=opts) as conn:  # type: ignore[no-untyped-call]
            return dict(conn.default_channel.queue(self.cfg.queue).stats())


class CeleryStock(CeleryStack):
    name = "celery-stock"

    def extra_stats(self) -> dict[str, Any]:
        r = redis.Redis(port=self.cfg.broker_port, client_name=f"{HARNESS_CLIENT}-stats")
        try:
            return {"queue_len": r.llen(self.cfg.queue), "unacked": r.hlen("unacked")}
        finally:
            r.close()


class RQStack(Stack):
    framework = "rq"
    ready_marker = "Listening on"
    worker_class = "rq.Worker"

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__(cfg)
        import rq

        self.conn = redis.Redis(port=cfg.broker_port, client_name=f"{HARNESS_CLIENT}-producer")
        self.queue = rq.Queue(cfg.queue, connection=self.conn)

    def worker_cmd(self, name: str) -> list[str]:
        return [
            RQ_BIN, "worker", "-u", self.broker_url, "-w", self.worker_class, "-n", name,
            "--with-scheduler", "--maintenance-interval", str(RQ_MAINTENANCE_S),
            "--worker-ttl", str(RQ_WORKER_TTL_S),
            "--logging_level", "INFO", self.cfg.queue,
        ]  # fmt: skip

    def publish(self, task_id: str, seconds: float, delay_s: float) -> None:
        opts: dict[str, Any] = dict(
            job_id=task_id, result_ttl=600, job_timeout=int(max(180, 4 * self.cfg.long_task_s))
        )
        func = "benchmarks.chaos.rq_jobs.work"
        if delay_s > 0:
            self.queue.enqueue_in(timedelta(seconds=delay_s), func, task_id, seconds, **opts)
        else:
            self.queue.enqueue(func, task_id, seconds, **opts)

    def extra_stats(self) -> dict[str, Any]:
        from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

        # ZCARD, not ``.count``: RQ's count runs the registry cleanup, which would fail
        # started jobs of dead workers itself.
        q = self.queue
        return {
            "queue_len": self.conn.llen(q.key),
            "failed": self.conn.zcard(FailedJobRegistry(queue=q).key),
            "started": self.conn.zcard(StartedJobRegistry(queue=q).key),
            "scheduled": self.conn.zcard(ScheduledJobRegistry(queue=q).key),  # type: ignore[no-untyped-call]
        }

    def waiting_ids(self) -> dict[str, list[str]]:
        from rq.registry import FailedJobRegistry, ScheduledJobRegistry

        q = self.queue
        scheduled = ScheduledJobRegistry(queue=q)  # type: ignore[no-untyped-call]
        return {
            "rq_scheduled": _names(self.conn.zrange(scheduled.key, 0, -1)),
            "rq_failed": _names(self.conn.zrange(FailedJobRegistry(queue=q).key, 0, -1)),
        }

    def close(self) -> None:
        self.conn.close()


class RQBelayq(RQStack):
    name = "rq-belayq"
    belayq = True
    worker_class = "benchmarks.chaos.rq_jobs.ChaosWorker"

    def core_stats(self) -> dict[str, Any] | None:
        from .rq_jobs import ChaosQueue

        q = ChaosQueue(
            self.cfg.queue, connection=self.conn, lease_ms=round(self.cfg.lease_s * 1000),
            max_deliveries=self.cfg.max_deliveries,
        )  # fmt: skip
        return dict(q.belayq().stats())


class RQStock(RQStack):
    name = "rq-stock"


def _names(items: Any) -> list[str]:
    return [x.decode() if isinstance(x, bytes) else str(x) for x in items]


def make_stack(name: str, cfg: StackConfig) -> Stack:
    classes: dict[str, type[Stack]] = {
        "celery-belayq": CeleryBelayq,
        "celery-stock": CeleryStock,
        "rq-belayq": RQBelayq,
        "rq-stock": RQStock,
    }
    return classes[name](cfg)
