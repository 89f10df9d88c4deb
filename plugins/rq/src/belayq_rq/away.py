"""RQ's worker bookkeeping while the server is away (it restarts, or fails over).

RQ stops a worker on any error outside its dequeue, even a lost connection while it writes
a heartbeat. The writes below are repeated soon anyway (the worker's hash and heartbeats,
the job's working time, the worker's state, the suspension check, the maintenance pass),
so one that cannot reach the server is skipped, and the worker goes on: on the new primary
once its client finds it (a Sentinel-managed client asks the sentinels).

A worker that starts while the server is away (a replacement started during a failover,
before the sentinels name the new primary) waits for it instead: RQ's records of its start
(its client name, its birth, its command channel) are retried with a backoff for up to the
worker's ttl, then the worker exits with a message that says so. The scheduler that
``--with-scheduler`` starts is left to the maintenance pass, which starts it again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
import rq.worker
from rq.job import Job
from rq.utils import utcformat

log = logging.getLogger("belayq_rq")

#: What a restarting or failing-over server answers (LOADING is a ConnectionError).
SERVER_AWAY = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)
#: First and longest pause between the tries of a start-up write (s).
_START_FIRST_PAUSE_S = 0.1
_START_MAX_PAUSE_S = 2.0


def skipped_if_away(what: str, call: Any, *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)``; an error of a server that is away is logged and skipped
    (queued on a caller's pipeline, nothing is sent, so nothing can fail here)."""
    try:
        call(*args, **kwargs)
    except SERVER_AWAY as exc:
        log.warning("RQ's %s write skipped: the server is away (%s)", what, exc)


def waited_for_if_away(what: str, call: Any, wait_s: float) -> None:
    """``call()``, tried again with a backoff while the server is away, for ``wait_s`` s.

    Raises:
        redis.ConnectionError: Still away after ``wait_s`` s (RQ's CLI prints the message
            and exits).
    """
    deadline = time.monotonic() + wait_s
    pause = _START_FIRST_PAUSE_S
    while True:
        try:
            call()
            return
        except SERVER_AWAY as exc:
            if time.monotonic() + pause > deadline:
                raise redis.ConnectionError(
                    f"belayq_rq: the Redis server was away for {wait_s:g} s (the worker's ttl) "
                    f"as the worker started ({what}), so it gives up: {exc}"
                ) from exc
            log.warning(
                "RQ's %s at the worker's start: the server is away (%s); waiting", what, exc
            )
            time.sleep(pause)
            pause = min(pause * 2, _START_MAX_PAUSE_S)


class SkipsBookkeepingWhileAway(rq.worker.BaseWorker):
    """RQ's own repeated writes skipped, and its start-up writes waited for, while the server
    is away (see the module doc)."""

    _belayq_birth_sent = False

    # -- the start: wait for the server ---------------------------------------------------

    def _set_ip_address(self, connection: Any) -> None:
        set_address = super()._set_ip_address
        waited_for_if_away("client name", lambda: set_address(connection), self.worker_ttl)

    def register_birth(self) -> None:
        waited_for_if_away("birth", self._register_birth_once, self.worker_ttl)

    def _register_birth_once(self) -> None:
        try:
            super().register_birth()  # type: ignore[no-untyped-call]
        except ValueError:
            # "an active worker named ... already": our own birth, whose reply was lost.
            if not (self._belayq_birth_sent and self._birth_is_ours()):
                raise
        except SERVER_AWAY:
            self._belayq_birth_sent = self.birth_date is not None
            raise

    def _birth_is_ours(self) -> bool:
        assert self.birth_date is not None
        stored = self.connection.hmget(self.key, ["birth", "pid"])
        return [x.decode() if isinstance(x, bytes) else x for x in stored] == [
            utcformat(self.birth_date),
            str(self.pid),
        ]

    def subscribe(self) -> None:
        waited_for_if_away("command channel", super().subscribe, self.worker_ttl)

    def _start_scheduler(self, *args: Any, **kwargs: Any) -> None:
        # The maintenance pass starts the scheduler again once its lock can be taken.
        skipped_if_away("scheduler start", super()._start_scheduler, *args, **kwargs)

    # -- RQ's repeated bookkeeping: skip it -----------------------------------------------

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
