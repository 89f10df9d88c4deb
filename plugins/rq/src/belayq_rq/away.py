"""RQ's worker bookkeeping while the server is away (it restarts, or fails over).

RQ stops a worker on any error outside its dequeue, even a lost connection while it writes
a heartbeat. The writes below are repeated soon anyway (the worker's hash and heartbeats,
the job's working time, the worker's state, the suspension check, the maintenance pass),
so one that cannot reach the server is skipped, and the worker goes on: on the new primary
once its client finds it (a Sentinel-managed client asks the sentinels).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
import rq.worker
from rq.job import Job

log = logging.getLogger("belayq_rq")

#: What a restarting or failing-over server answers (LOADING is a ConnectionError).
SERVER_AWAY = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)


def skipped_if_away(what: str, call: Any, *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)``; an error of a server that is away is logged and skipped
    (queued on a caller's pipeline, nothing is sent, so nothing can fail here)."""
    try:
        call(*args, **kwargs)
    except SERVER_AWAY as exc:
        log.warning("RQ's %s write skipped: the server is away (%s)", what, exc)


class SkipsBookkeepingWhileAway(rq.worker.BaseWorker):
    """RQ's own repeated writes, skipped while the server is away (see the module doc)."""

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        skipped_if_away("heartbeat", super().heartbeat, timeout, pipeline=pipeline)

    def maintain_heartbeats(self, job: Job) -> None:
        skipped_if_away("heartbeat", super().maintain_heartbeats, job)

    def set_current_job_working_time(self, working_time: float, pipeline: Any = None) -> None:
        skipped_if_away(
            "working time", super().set_current_job_working_time, working_time, pipeline=pipeline
        )

    def set_state(self, state: str, pipeline: Any = None) -> None:
        skipped_if_away("state", super().set_state, state, pipeline=pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        skipped_if_away("suspension check", super().check_for_suspension, burst)

    def run_maintenance_tasks(self) -> None:
        skipped_if_away("maintenance", super().run_maintenance_tasks)
