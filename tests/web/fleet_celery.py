"""The Celery app of the live-fleet test (``celery -A tests.web.fleet_celery worker``), on
``belayq://`` at ``FLEET_PORT``, results in db 1: tasks that succeed, raise, retry, are
rejected (dead-lettered) and run long."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from celery.exceptions import Reject

import belayq_kombu  # noqa: F401  (registers belayq://)

PORT = os.environ.get("FLEET_PORT", "6379")
QUEUE = "fleet_c"
IDLE = "fleet_c_idle"  # no worker consumes it
app = Celery("fleet", broker=f"belayq://127.0.0.1:{PORT}/0",
             backend=f"redis://127.0.0.1:{PORT}/1")
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 20, "sweep_interval": 0.5},
)


@app.task
def ok(i: int) -> int:
    return i


@app.task
def boom(i: int) -> None:
    raise ValueError(f"task {i} always fails")


@app.task(bind=True, max_retries=1)
def flaky(self: Any, i: int) -> int:
    """Fails its first run, retried 0.2 s later, and succeeds."""
    if self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return i


@app.task
def rejected(i: int) -> None:
    raise Reject(f"task {i} is refused", requeue=False)


@app.task
def long(seconds: float) -> None:
    time.sleep(seconds)
