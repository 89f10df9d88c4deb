"""The Dramatiq side of the chaos workers (``dramatiq benchmarks.chaos.dramatiq_app``): the
actor and the broker, configured from the environment the harness sets:
``CHAOS_DRAMATIQ`` (``belayq``, ``belayq-shards`` or ``stock``), ``CHAOS_BROKER``, ``CHAOS_QUEUE``,
``CHAOS_LEASE_MS``, ``CHAOS_SWEEP_MS``, ``CHAOS_MAX_DELIVERIES``, ``CHAOS_WAIT_REPLICAS``."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from .ledger import run_task

_env = os.environ.get
ACTOR = "work"


def make_broker(kind: str, url: str) -> dramatiq.Broker:
    """The stack's broker: stock ``RedisBroker``, or ``belayq_dramatiq.Broker`` (in stock's
    keys; with ``belayq-shards``, in belayq's own over 3 shards)."""
    if kind == "stock":
        return RedisBroker(url=url)
    from belayq_dramatiq import Broker

    return Broker(
        url=url,
        lease_ms=int(_env("CHAOS_LEASE_MS", "5000")),
        max_deliveries=int(_env("CHAOS_MAX_DELIVERIES", "50")),
        belayq_options={
            "sweep_interval_ms": int(_env("CHAOS_SWEEP_MS", "500")),
            "wait_replicas": int(_env("CHAOS_WAIT_REPLICAS", "0")),
        },
        shards=3 if kind == "belayq-shards" else None,
    )


if "CHAOS_BROKER" in os.environ:  # a worker (the harness's own process imports make_broker)
    broker = make_broker(_env("CHAOS_DRAMATIQ", "belayq"), os.environ["CHAOS_BROKER"])
    dramatiq.set_broker(broker)

    @dramatiq.actor(actor_name=ACTOR, queue_name=_env("CHAOS_QUEUE", "default"),
                    max_retries=0, time_limit=3_600_000)
    def work(task_id: str, seconds: float) -> str:
        return run_task(task_id, seconds)
