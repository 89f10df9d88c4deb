"""``belayq_rq.Worker`` and ``belayq_rq.SimpleWorker``: RQ's workers, settling belayq claims.

What they add to RQ's workers:

* the queues are ``belayq_rq.Queue`` even when RQ's CLI passes its stock default;
* the claim of a job is acked inside each transaction RQ runs to record the job's end
  (success, failure, retry, max retries, stop): ``cleanup_execution`` is called in all of
  them;
* the lease is extended while the job runs, by the belayq lease keeper thread of the
  process that claimed it: the forking worker's parent, which runs no job code, so a job
  that holds the GIL in the work horse cannot starve it;
* an attempt that is lost while the worker lives (the work horse was killed, e.g. by the
  OOM killer; a cold shutdown of a SimpleWorker) hands the job back for another delivery
  instead of failing it; after ``max_deliveries`` lost attempts it goes to the
  FailedJobRegistry;
* each maintenance pass first runs belayq's sweep, and spares from RQ's abandoned-job
  cleanup the jobs that the sweep already put back in their queue, and jobs that ended;
* a server that restarts or fails over stops neither the worker (RQ's own bookkeeping
  writes are skipped while it is away, and a worker that starts then waits for it: see
  ``away.py``) nor a job (a run whose end RQ could not record is left to its claim instead
  of being FAILED by the connection error).

* RQ's own bookkeeping repeats are sent once: a heartbeat that would set the worker key's
  expiry within ``_REPEAT_S`` of the one just sent to the same TTL, and a state already
  written within ``_REPEAT_S`` (RQ sends three heartbeats and two "idle" writes around
  every job). Nothing RQ, ``rq info`` or a dashboard reads changes by more than that.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import redis
import rq
import rq.worker
from rq.exceptions import ShutDownImminentException
from rq.job import Job
from rq.queue import Queue as RQQueue
from rq.worker import WorkerStatus

from belayq import BelayqError

from . import settle
from .away import SERVER_AWAY as _SERVER_AWAY
from .away import SkipsBookkeepingWhileAway, skipped_if_away
from .claims import claim_of, driving, flush_observations
from .maintenance import spare_requeued
from .pubsub import StopsItsPubSub
from .queue import Queue
from .scheduler import StopsItsScheduler

log = logging.getLogger("belayq_rq")
#: RQ's own heartbeats and state writes repeated within this (s) are sent once.
_REPEAT_S = 0.1
#: RQ's records of a job's start are retried for this share of the lease while the server
#: restarts or fails over: the job has not started, and the other half still lets the
#: keeper extend the claim before it expires.
_START_RETRY_SHARE_OF_LEASE = 0.5
#: First and longest pause between those retries (s).
_START_RETRY_FIRST_PAUSE_S = 0.05
_START_RETRY_MAX_PAUSE_S = 1.0


def _upgrade_queue_class(owner: type, queue_class: Any) -> type[Queue]:
    """The belayq queue class to use when RQ (its CLI, ``run_worker``) passes ``queue_class``."""
    default: type[Queue] = owner.queue_class  # type: ignore[attr-defined]
    if isinstance(queue_class, str):
        from rq.utils import import_attribute

        queue_class = import_attribute(queue_class)
    if queue_class is None or queue_class is RQQueue:
        return default
    if isinstance(queue_class, type) and issubclass(queue_class, Queue):
        return queue_class
    raise TypeError(
        f"{owner.__qualname__} needs belayq_rq.Queue (or a subclass) as its queue class, "
        f"got {queue_class!r}: drop --queue-class, or pass a subclass of belayq_rq.Queue"
    )


def _upgrade_queues(queues: Any, queue_class: type[Queue]) -> Any:
    """Turn stock ``rq.Queue`` objects (built by RQ's CLI) into ``queue_class`` ones."""
    if isinstance(queues, (str, RQQueue)):
        queues = [queues]
    out: list[Any] = []
    for q in queues:
        if isinstance(q, (Queue, str)):
            out.append(q)
        elif type(q) is RQQueue:
            out.append(
                queue_class(
                    q.name,
                    connection=q.connection,
                    job_class=q.job_class,
                    serializer=q.serializer,
                    death_penalty_class=q.death_penalty_class,
                    default_timeout=getattr(q, "_default_timeout", None),
                    is_async=q.is_async,
                )
            )
        else:
            raise TypeError(
                f"belayq_rq workers need belayq_rq.Queue objects, got {type(q).__qualname__} "
                f"{q.name!r}: build the queues with belayq_rq.Queue"
            )
    return out


def _client_info_resolved(client: Any) -> None:
    """Give the connections ``client``'s pool makes from now on the client name and version
    for ``CLIENT SETINFO`` already resolved. redis-py 7.1+ otherwise reads its own package
    metadata (``importlib.metadata``, 1.5-3 ms) for every new connection, and a work horse
    makes one for every job. What the server is told stays the same. Nothing is changed
    when the caller chose ``driver_info``, ``lib_name`` or ``lib_version`` itself, or on
    an older redis-py or a cluster client (no connection pool)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict) or {"driver_info", "lib_name", "lib_version"} & set(kwargs):
        return
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py < 7.1 resolves it once, at import
        return
    kwargs["driver_info"] = DriverInfo()


class BelayqWorkerMixin(SkipsBookkeepingWhileAway, StopsItsScheduler, StopsItsPubSub):
    """The belayq parts of :class:`Worker` and :class:`SimpleWorker` (see the module doc)."""

    queue_class = Queue
    _belayq_lost: str | None = None
    _belayq_unrecorded: str | None = None
    _belayq_killed_on_purpose = False

    def __init__(self, queues: Any, *args: Any, **kwargs: Any) -> None:
        spawn = getattr(rq.worker, "SpawnWorker", None)  # rq >= 2.2
        if spawn is not None and isinstance(self, spawn):
            raise TypeError(
                "SpawnWorker runs each job with RQ's stock classes in a new interpreter, where "
                "belayq cannot ack it: use belayq_rq.Worker (fork) or belayq_rq.SimpleWorker"
            )
        queue_class = _upgrade_queue_class(type(self), kwargs.get("queue_class"))
        kwargs["queue_class"] = queue_class
        super().__init__(_upgrade_queues(queues, queue_class), *args, **kwargs)

    # -- RQ's repeated bookkeeping, sent once ----------------------------------------------

    #: When this worker last sent a heartbeat of RQ's default TTL itself (monotonic s);
    #: -inf once any other heartbeat may have set another TTL since.
    _belayq_beat_at = float("-inf")
    _belayq_state_at: tuple[str, float] = ("", float("-inf"))
    #: Inside :meth:`execute_job`: RQ's "idle" write at its end rides on the next heartbeat.
    _belayq_job_ending = False
    #: A state written locally whose write waits for the next heartbeat.
    _belayq_pending_state: str | None = None

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat; one of the default TTL sent within ``_REPEAT_S`` of the last one
        of the default TTL (its own, or one queued on a caller's pipeline; nothing in between
        set another TTL) is skipped, and a sent one is one round trip."""
        now = time.monotonic()
        if timeout is not None:
            self._belayq_beat_at = float("-inf")  # it may set another expiry: send the next
            super().heartbeat(timeout, pipeline=pipeline)
            return
        if pipeline is not None:
            # The default TTL, sent by the caller's pipeline (RQ's suspension check runs it
            # at once): a default beat right after it repeats it.
            super().heartbeat(timeout, pipeline=pipeline)
            self._belayq_beat_at = now
            return
        pending = self._belayq_pending_state
        if now - self._belayq_beat_at < _REPEAT_S and pending is None:
            return
        beat = super().heartbeat
        write_state = super().set_state

        def send() -> None:
            with self.connection.pipeline(transaction=False) as pipe:
                if pending is not None:  # the state a job's end left to this beat
                    write_state(pending, pipeline=pipe)
                beat(timeout, pipeline=pipe)  # queued: sent by execute()
                pipe.execute()
            self._belayq_beat_at = now
            if pending is not None and self._belayq_pending_state == pending:
                self._belayq_pending_state = None
                self._belayq_state_at = (pending, now)

        # A server that restarts or fails over skips the beat, as it does RQ's own.
        skipped_if_away("heartbeat", send)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's state write; the same state this worker wrote itself within ``_REPEAT_S``
        is not written again."""
        now = time.monotonic()
        last, at = self._belayq_state_at
        if pipeline is None and state == last == self._state and now - at < _REPEAT_S:
            return
        if pipeline is None and state == WorkerStatus.IDLE and self._belayq_job_ending:
            # RQ's last write of a job's run: its loop sends the worker's heartbeat next,
            # which carries it (one round trip less per job).
            self._state = state
            self._belayq_pending_state = state
            return
        self._belayq_pending_state = None
        super().set_state(state, pipeline=pipeline)
        self._belayq_state_at = (state, now) if pipeline is None else ("", float("-inf"))

    # -- marking what this worker drives (the queues refuse stock workers) ---------------

    def work(self, *args: Any, **kwargs: Any) -> bool:
        try:
            with driving(self):
                return bool(super().work(*args, **kwargs))
        finally:
            flush_observations(self.connection)

    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        with driving(self):
            return super().dequeue_job_and_maintain_ttl(*args, **kwargs)

    # -- settling inside RQ's transactions -----------------------------------------------

    def cleanup_execution(self, job: Job, pipeline: Any) -> None:
        """RQ calls this inside the transaction of every end of a job: ack the claim there."""
        super().cleanup_execution(job, pipeline)
        claim = claim_of(job)
        if claim is not None:
            claim.core.ack_on(pipeline, [claim.delivery])

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """RQ's records of the start (idempotent field and key writes), retried while the
        server restarts or fails over, for up to half the fresh lease: the job has not
        started, so a lost connection here is no failure of the job. belayq never uses
        RQ's intermediate list; its removal command is skipped."""
        claim = claim_of(job)
        retry_s = claim.core.config.lease_ms / 1000 * _START_RETRY_SHARE_OF_LEASE if claim else 0
        deadline = time.monotonic() + retry_s
        pause = _START_RETRY_FIRST_PAUSE_S
        while True:
            try:
                super().prepare_job_execution(job, False)
                return
            except _SERVER_AWAY:
                if claim is None:
                    raise
                if time.monotonic() + pause >= deadline:
                    # Still away: the attempt is lost, not failed (handle_job_failure).
                    self._belayq_lost = job.id
                    raise
                log.warning("job %s: the server is away before the start; retrying", job.id)
                time.sleep(pause)
                pause = min(pause * 2, _START_RETRY_MAX_PAUSE_S)

    def handle_execution_ended(self, *args: Any, **kwargs: Any) -> None:
        with self._end_unrecorded(kwargs.get("job") or args[0]):
            super().handle_execution_ended(*args, **kwargs)

    def handle_job_success(self, *args: Any, **kwargs: Any) -> None:
        with self._end_unrecorded(kwargs.get("job") or args[0]):
            super().handle_job_success(*args, **kwargs)

    @contextlib.contextmanager
    def _end_unrecorded(self, job: Job) -> Iterator[None]:
        """RQ's records of a run's end did not reach a server that is away (a restart, a
        failover): RQ would record the job as FAILED by that error. The claim decides
        instead (see :meth:`handle_job_failure`)."""
        try:
            yield
        except _SERVER_AWAY:
            if claim_of(job) is not None:
                self._belayq_unrecorded = job.id
            raise

    def execute_job(self, job: Job, queue: RQQueue) -> None:
        self._belayq_killed_on_purpose = False
        self._belayq_job_ending = True
        try:
            super().execute_job(job, queue)
        except _SERVER_AWAY as exc:
            # RQ's own records around the run (before the fork, or after the work horse
            # ended) could not be written: the server restarts or fails over. RQ's loop would
            # stop the worker; the job's fate is in its claim instead: acked by the horse,
            # or left to expire and be redelivered.
            log.warning("job %s: the server is away around the run (%s); going on", job.id, exc)
        finally:
            self._belayq_job_ending = False
            claim = claim_of(job)
            if claim is not None:
                # Settled by now (the work horse acked, or it was handed back); a claim the
                # horse could not settle is left to expire, and the sweep redelivers it.
                claim.core.forget([claim.delivery])

    def fork_work_horse(self, job: Job, queue: RQQueue) -> None:
        """RQ's fork; the work horse's new connection skips redis-py's metadata read."""
        _client_info_resolved(self.connection)
        super().fork_work_horse(job, queue)  # type: ignore[misc]  # forking workers only

    # -- lost attempts -------------------------------------------------------------------

    def kill_horse(self, *args: Any, **kwargs: Any) -> None:
        # RQ kills the horse on purpose for `rq` kill-horse and stop-job commands, a job
        # overrunning job.timeout + 60 s and a cold shutdown: none of them is a lost attempt.
        self._belayq_killed_on_purpose = True
        super().kill_horse(*args, **kwargs)

    def handle_work_horse_killed(self, job: Job, retpid: Any, ret_val: Any, rusage: Any) -> None:
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)  # type: ignore[no-untyped-call]
        if not self._belayq_killed_on_purpose:
            self._belayq_lost = job.id

    def handle_job_failure(
        self,
        job: Job,
        queue: RQQueue,
        started_job_registry: Any = None,
        exc_string: str = "",
    ) -> None:
        claim = claim_of(job)
        if claim is not None and self._belayq_unrecorded == job.id:
            # The run's end may or may not have landed (a reply lost after EXEC): record
            # nothing. If it landed, belayq's ack went with it; if not, the claim's lease
            # runs out and the sweep redelivers the job, which runs again.
            self._belayq_unrecorded = None
            log.warning("job %s: the server went away as the run ended; left to its claim "
                        "(acked with the end if it landed, else redelivered)", job.id)
            return
        lost = self._belayq_lost == job.id or self._cold_shutdown_in_job()
        self._belayq_lost = None
        stopped = getattr(self, "_stopped_job_id", None) == job.id
        if claim is None or not lost or stopped:
            if claim is not None and not stopped:
                claim.core.count_failed()  # before the end's transaction, which writes it
            super().handle_job_failure(
                job, queue, started_job_registry=started_job_registry, exc_string=exc_string
            )
            return
        cause = exc_string.strip() or "the attempt was interrupted"
        if claim.core.is_last_run(claim.delivery):
            settle.fail_for_good(
                job,
                queue,
                claim,
                settle.lost_reason(claim, cause),
                worker=self,
                death_penalty_class=getattr(self, "death_penalty_class", None),
            )
        else:
            settle.requeue_lost(job, claim, self, cause)

    def _cold_shutdown_in_job(self) -> bool:
        # A SimpleWorker's cold shutdown raises SystemExit inside the job, a HerokuWorker's
        # dyno shutdown ShutDownImminentException in the work horse: RQ would fail the job,
        # but the attempt was cut short, not failed.
        exc = sys.exc_info()[1]
        if isinstance(exc, ShutDownImminentException):
            return True
        return isinstance(exc, SystemExit) and bool(getattr(self, "_stop_requested", False))

    # -- maintenance ---------------------------------------------------------------------

    def clean_registries(self) -> None:
        """Sweep first, then let RQ clean; jobs the sweep put back are not abandoned."""
        with driving(self):
            self._clean_registries()

    def _clean_registries(self) -> None:
        for queue in self.queues:
            if not isinstance(queue, Queue):
                continue
            try:
                queue.belayq(self.connection).sweep()
                spare_requeued(queue)
            except (redis.RedisError, BelayqError):  # RQ's own cleanup below reports it
                log.warning("belayq sweep of %s failed", queue.name, exc_info=True)
        super().clean_registries()  # type: ignore[no-untyped-call]


class FewerRoundTripsMixin(rq.worker.BaseWorker):
    """Kept so that subclasses written for 0.2.0 still import: the default workers now send
    RQ's repeated heartbeats and state writes once (:class:`BelayqWorkerMixin`)."""


class Worker(BelayqWorkerMixin, rq.worker.Worker):
    """RQ's forking worker on belayq: ``rq worker -w belayq_rq.Worker``."""


class SimpleWorker(BelayqWorkerMixin, rq.worker.SimpleWorker):
    """RQ's in-process worker on belayq (works on fakeredis: ``SimpleWorker(burst=True)``).

    The lease keeper is a thread of the same process: a job that holds the GIL for longer
    than ``lease_ms`` (one long C call) starves it, and the job may then run twice. Use
    :class:`Worker` for such jobs.
    """


class HerokuWorker(BelayqWorkerMixin, rq.worker.HerokuWorker):
    """RQ's HerokuWorker on belayq: a job cut short by a dyno shutdown runs again."""
