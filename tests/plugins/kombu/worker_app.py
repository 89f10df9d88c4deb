"""The Celery app the worker tests run (``celery -A worker_app worker``), configured from
the environment the ``workers`` fixture sets. Tasks record start/done events in Redis so
the tests can count executions across workers and kills."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq://)

env = os.environ.get
app = Celery("worker_app", broker=env("BQ_BROKER"), backend=env("BQ_BACKEND"))
app.conf.update(
    task_default_queue=env("BQ_QUEUE", "celery"),
    task_acks_late=env("BQ_ACKS_LATE", "1") == "1",
    task_reject_on_worker_lost=env("BQ_REJECT_ON_LOST", "1") == "1",
    worker_prefetch_multiplier=int(env("BQ_PREFETCH", "4")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(env("BQ_LEASE", "20")),
        "max_deliveries": int(env("BQ_MAX_DELIVERIES", "5")),
        "sweep_interval": float(env("BQ_SWEEP", "0.5")),
        "priority_bell": env("BQ_BELL", "1") == "1",
    },
    result_expires=600,
)
_records = redis.Redis.from_url(env("BQ_BACKEND", "redis://127.0.0.1:6379/1"))


def record(event: str, i: Any, request: Any) -> None:
    info = request.delivery_info or {}
    _records.rpush(env("BQ_RECORDS", "records"), json.dumps({
        "ev": event, "i": i, "pid": os.getpid(), "t": time.time(),
        "host": request.hostname, "redelivered": bool(info.get("redelivered")),
    }))


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(bind=True)
def sleeper(self: Any, i: int, seconds: float) -> int:
    record("start", i, self.request)
    time.sleep(seconds)
    record("done", i, self.request)
    return i


@app.task(bind=True)
def kill_self(self: Any, i: int) -> None:
    """A poison task: kills the process that runs it (a pool child, or a solo worker)."""
    record("start", i, self.request)
    os.kill(os.getpid(), signal.SIGKILL)
