"""The soak's Celery app (``celery -A benchmarks.soaking.celery_app worker``) and its
producer (:func:`make_app`), on ``belayq://`` with tracing on. Configured from the
environment the soak sets: ``SOAK_BROKER``, ``SOAK_CELERY_QUEUE``, ``SOAK_LEASE_S``,
``SOAK_MAX_DELIVERIES``.

A ``fail`` task raises (Celery acks it; belayq records the failed run), a ``retry:N`` task
retries itself with a countdown, and a ``dead`` task rejects itself without requeue, which
belayq dead-letters."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery  # type: ignore[import-untyped]
from celery.exceptions import Reject  # type: ignore[import-untyped]

import belayq_kombu  # noqa: F401  (registers belayq://)

from . import ledger

TASK_NAME = "soak.work"


def make_app(broker: str, queue: str, lease_s: float, max_deliveries: int) -> Celery:
    app = Celery("soak", broker=broker)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=4,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": lease_s, "sweep_interval": 0.5,
                                  "max_deliveries": max_deliveries},
    )

    @app.task(bind=True, name=TASK_NAME, max_retries=10)  # type: ignore[untyped-decorator]
    def work(self: Any, task_id: str, plan: str, seconds: float) -> str:
        attempt = ledger.start(task_id)
        if plan == "dead":
            ledger.end(task_id, attempt, "rejected")
            raise Reject("a poison message", requeue=False)
        try:
            ledger.behave(plan, attempt, seconds)
        except ledger.PlannedFailure as exc:
            if plan.startswith("retry:"):
                ledger.end(task_id, attempt, "retry")
                raise self.retry(exc=exc, countdown=1) from None
            ledger.end(task_id, attempt, "failed")
            raise
        ledger.end(task_id, attempt, "ok")
        return task_id

    return app


_env = os.environ.get
if "SOAK_BROKER" in os.environ:  # a worker (the soak's own process calls make_app)
    ledger.trace("celery")
    app = make_app(os.environ["SOAK_BROKER"], _env("SOAK_CELERY_QUEUE", "soak-celery"),
                   float(_env("SOAK_LEASE_S", "5")), int(_env("SOAK_MAX_DELIVERIES", "5")))
