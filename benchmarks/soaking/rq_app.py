"""The soak's RQ side (``rq worker -w benchmarks.soaking.rq_app.SoakWorker``): the job
function and belayq_rq's classes, with tracing on, configured from ``SOAK_LEASE_S`` and
``SOAK_MAX_DELIVERIES``.

A ``fail`` job raises (RQ's FailedJobRegistry keeps it), a ``retry:N`` job is enqueued with
RQ's ``Retry`` and raises on its first N runs, and a ``dead`` job kills its own work horse
on every run, until belayq's ``max_deliveries`` puts it in the FailedJobRegistry."""

from __future__ import annotations

import os
import signal
from typing import ClassVar

import belayq_rq

from . import ledger

_env = os.environ.get


def work(task_id: str, plan: str, seconds: float) -> str:
    attempt = ledger.start(task_id)
    if plan == "dead":
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        ledger.behave(plan, attempt, seconds)
    except ledger.PlannedFailure:
        ledger.end(task_id, attempt, "retry" if plan.startswith("retry:") else "failed")
        raise
    ledger.end(task_id, attempt, "ok")
    return task_id


class SoakQueue(belayq_rq.Queue):
    lease_ms = round(float(_env("SOAK_LEASE_S", "5")) * 1000)
    max_deliveries = int(_env("SOAK_MAX_DELIVERIES", "5"))
    belayq_options: ClassVar = {"sweep_interval_ms": 500}


class SoakWorker(belayq_rq.Worker):
    queue_class = SoakQueue


if "SOAK_WORKER" in os.environ:  # a worker (the soak's own process traces on its own)
    ledger.trace("rq")
