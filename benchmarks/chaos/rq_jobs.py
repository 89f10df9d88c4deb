"""The RQ side of the chaos workers: the job function and the belayq queue/worker classes
(``rq worker -w benchmarks.chaos.rq_jobs.ChaosWorker``), configured from the environment
the harness sets (``CHAOS_LEASE_MS``, ``CHAOS_SWEEP_MS``, ``CHAOS_MAX_DELIVERIES``,
``CHAOS_WAIT_REPLICAS``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import belayq_rq

from .ledger import run_task

_env = os.environ.get


def work(task_id: str, seconds: float) -> str:
    return run_task(task_id, seconds)


class ChaosQueue(belayq_rq.Queue):
    lease_ms = int(_env("CHAOS_LEASE_MS", "5000"))
    max_deliveries = int(_env("CHAOS_MAX_DELIVERIES", "50"))
    belayq_options: ClassVar[Mapping[str, Any]] = {
        "sweep_interval_ms": int(_env("CHAOS_SWEEP_MS", "500")),
        "wait_replicas": int(_env("CHAOS_WAIT_REPLICAS", "0")),
    }


class ChaosWorker(belayq_rq.Worker):
    queue_class = ChaosQueue
