"""The Celery app of the chaos workers (``celery -A benchmarks.chaos.celery_app worker``),
configured from the environment the harness sets, and the producer's app (:func:`make_app`).

Both stacks run with ``task_acks_late=True`` and ``task_reject_on_worker_lost=True``;
``CHAOS_BROKER`` is a ``belayq://`` URL (lease = ``visibility_timeout``) or a stock
``redis://`` URL (``visibility_timeout`` as given: the stock restore timeout), or their
Sentinel forms (``sentinel://...;sentinel://...`` with ``master_name`` =
``CHAOS_MASTER_NAME``); ``CHAOS_WAIT_REPLICAS`` > 0 adds belayq's ``wait_replicas``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery  # type: ignore[import-untyped]

import belayq_kombu  # noqa: F401  (registers belayq://)

from .ledger import run_task

TASK_NAME = "chaos.work"


def transport_options(
    broker: str, lease_s: float, sweep_s: float, max_deliveries: int, *,
    master_name: str = "", wait_replicas: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """The ``broker_transport_options`` of a stack: belayq's lease, sweep and delivery cap
    (and ``wait_replicas`` when > 0), or the stock transport's ``visibility_timeout`` set to
    the same number of seconds; ``master_name`` for a Sentinel URL."""
    opts: dict[str, Any] = {"visibility_timeout": lease_s}
    if broker.startswith("belayq"):
        opts.update(sweep_interval=sweep_s, max_deliveries=max_deliveries)
        if wait_replicas:
            opts["wait_replicas"] = wait_replicas
    if "sentinel" in broker.split("://", 1)[0]:
        opts["master_name"] = master_name
    return opts


def make_app(
    broker: str, queue: str, lease_s: float, sweep_s: float, max_deliveries: int, *,
    master_name: str = "", wait_replicas: int = 0,
) -> Celery:  # fmt: skip
    app = Celery("chaos", broker=broker)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=4,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_transport_options=transport_options(
            broker,
            lease_s,
            sweep_s,
            max_deliveries,
            master_name=master_name,
            wait_replicas=wait_replicas,
        ),
    )

    @app.task(name=TASK_NAME)  # type: ignore[untyped-decorator]
    def work(task_id: str, seconds: float) -> str:
        return run_task(task_id, seconds)

    return app


_env = os.environ.get
app = make_app(
    _env("CHAOS_BROKER", "memory://"),
    _env("CHAOS_QUEUE", "celery"),
    float(_env("CHAOS_LEASE_S", "5")),
    float(_env("CHAOS_SWEEP_S", "0.5")),
    int(_env("CHAOS_MAX_DELIVERIES", "50")),
    master_name=_env("CHAOS_MASTER_NAME", ""),
    wait_replicas=int(_env("CHAOS_WAIT_REPLICAS", "0")),
)
