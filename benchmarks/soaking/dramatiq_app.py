"""The soak's Dramatiq side (``dramatiq benchmarks.soaking.dramatiq_app``): the actor on
``belayq_dramatiq.Broker`` with tracing on, configured from ``SOAK_DRAMATIQ_URL``,
``SOAK_DRAMATIQ_QUEUE``, ``SOAK_LEASE_S`` and ``SOAK_MAX_DELIVERIES``.

Retries are Dramatiq's own (the Retries middleware, with each message's ``max_retries``):
a ``retry:N`` message succeeds after N failed runs, and a ``fail`` or ``dead`` one is
dead-lettered once its retries are spent (``fail`` has none, ``dead`` two)."""

from __future__ import annotations

import os
from typing import Any

import dramatiq

from . import ledger

ACTOR = "soak_work"
_env = os.environ.get


def make_broker(url: str) -> dramatiq.Broker:
    from belayq_dramatiq import Broker

    return Broker(url=url, lease_ms=round(float(_env("SOAK_LEASE_S", "5")) * 1000),
                  max_deliveries=int(_env("SOAK_MAX_DELIVERIES", "5")),
                  belayq_options={"sweep_interval_ms": 500})


def message(queue: str, task_id: str, plan: str, seconds: float) -> dramatiq.Message[Any]:
    """The message of a task: its id is the task id; its retries follow its plan."""
    retries = int(plan.split(":", 1)[1]) + 1 if plan.startswith("retry:") else (
        2 if plan == "dead" else 0)
    return dramatiq.Message(queue_name=queue, actor_name=ACTOR, args=(task_id, plan, seconds),
                            kwargs={}, options={"max_retries": retries, "min_backoff": 200,
                                                "max_backoff": 1000},
                            message_id=task_id)


if "SOAK_DRAMATIQ_URL" in os.environ:  # a worker
    ledger.trace("dramatiq")
    broker = make_broker(os.environ["SOAK_DRAMATIQ_URL"])
    dramatiq.set_broker(broker)

    @dramatiq.actor(actor_name=ACTOR, queue_name=_env("SOAK_DRAMATIQ_QUEUE", "soak-dramatiq"),
                    max_retries=0, time_limit=600_000)
    def soak_work(task_id: str, plan: str, seconds: float) -> str:
        attempt = ledger.start(task_id)
        try:
            ledger.behave(plan, attempt, seconds)
        except ledger.PlannedFailure:
            ledger.end(task_id, attempt, "retry" if plan.startswith("retry:") else "failed")
            raise
        ledger.end(task_id, attempt, "ok")
        return task_id
