"""``belayq_rq.Queue``: RQ's queue with belayq's claim.

Producers are untouched: ``enqueue``, ``enqueue_many``, the scheduler, ``Retry``,
``rq requeue`` and everything else keep pushing job ids to RQ's own list
``rq:queue:NAME``, which is the core's ready list. Only the claim changes: a job id moves
into the core's processing list with a lease and a fencing token, and the worker acks it
inside the transaction that records the job's outcome.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import warnings
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

import redis
from redis import Redis
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.job import Job
from rq.queue import Queue as RQQueue

from belayq import ConfigError, ConnectionLost, Delivery, QueueConfig, ReliableQueue
from belayq.claim_any import claim_any
from belayq.errors import BelayqError
from belayq.option_names import misspells, refuse_misspelled, unknown_option

from . import settle
from .claims import (
    Claim,
    attach,
    core_for,
    core_options,
    count_enqueued,
    counted_at_enqueue,
    driven,
)

if TYPE_CHECKING:
    from rq.serializers import Serializer
    from rq.timeouts import BaseDeathPenalty

    from belayq.admin import Purged
    from belayq.sharded import AnyQueue

log = logging.getLogger("belayq_rq")

#: The keywords RQ's Queue takes (it accepts any other and ignores it; "async" is its
#: deprecated spelling of is_async).
_RQ_KEYWORDS = {
    p.name for p in inspect.signature(RQQueue.__init__).parameters.values()
    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
} | {"async"}
#: belayq_rq.Queue's own keywords.
_OWN_KEYWORDS = ("lease_ms", "max_deliveries", "belayq_options")
#: belayq's queue options, which belayq_rq.Queue takes in ``belayq_options``.
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(QueueConfig)} - set(_OWN_KEYWORDS)


def _check_keywords(owner: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword that is meant for belayq but misspelled or misplaced; warn about
    one that neither RQ's Queue nor belayq_rq uses (RQ's Queue accepts and ignores it, so a
    working app that passes one keeps working).

    Raises:
        UnknownOption: Naming the keyword and the valid ones.
    """
    unused = set(kwargs) - _RQ_KEYWORDS
    what = "belayq_rq.Queue option"
    more = "and RQ's Queue arguments"
    for name in sorted(unused):
        field = name if name in _CONFIG_FIELDS else misspells(name, _CONFIG_FIELDS)
        if field is not None:
            raise unknown_option(
                name, _OWN_KEYWORDS, what=what, more=more,
                hint=f"{field!r} is a belayq.QueueConfig field: pass it as "
                f"belayq_options={{{field!r}: ...}}",
            )
    for name in refuse_misspelled(unused, _OWN_KEYWORDS, what=what, more=more):
        warnings.warn(
            f"{owner}() ignores the keyword {name!r}, as RQ's Queue does: neither uses it "
            f"(RQ's Queue takes {', '.join(sorted(_RQ_KEYWORDS))}; belayq_rq adds "
            f"{', '.join(_OWN_KEYWORDS)})",
            IgnoredKeywordWarning,
            stacklevel=3,
        )


class IgnoredKeywordWarning(UserWarning):
    """A keyword given to :class:`Queue` that neither RQ's Queue nor belayq_rq uses."""


class Queue(RQQueue):
    """An RQ queue whose jobs are claimed with a lease, so a dead worker's job runs again.

    Configure it with class attributes (subclass) or keyword arguments:

    Attributes:
        lease_ms: How long a claim stays valid without an extension (ms). A live worker
            extends it every sweep period or third of the lease, whichever is shorter (every
            second by default); a dead worker's job is back in the queue within about
            ``lease_ms`` + 1 s. Default 20 s.
        max_deliveries: Attempts a job may lose (its worker or work horse died) before it
            goes to the FailedJobRegistry instead of running again. Default 5.
        belayq_options: Further :class:`belayq.QueueConfig` fields (``sweep_interval_ms``,
            ``sweep_limit``, ...).
    """

    lease_ms: ClassVar[int] = 20_000
    max_deliveries: ClassVar[int] = 5
    belayq_options: ClassVar[Mapping[str, Any]] = {}

    def __init__(
        self,
        name: str = "default",
        connection: Redis | None = None,
        *args: Any,
        lease_ms: int | None = None,
        max_deliveries: int | None = None,
        belayq_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """RQ's Queue arguments, and belayq's options (see the class doc).

        A keyword that RQ's Queue accepts and ignores, and belayq_rq ignores too (such as
        ``result_ttl``, an option of ``enqueue``), is accepted with a warning, as the stock
        class accepts it.

        Raises:
            UnknownOption: A keyword that misspells a belayq option (``lease_msec``), or a
                :class:`belayq.QueueConfig` field given outside ``belayq_options``; it
                names the keyword and lists the valid ones (a ``TypeError`` too).
            ConfigError: A belayq option that is unknown, set by belayq_rq itself, or out
                of range.
        """
        _check_keywords(type(self).__qualname__, kwargs)
        extra = {} if belayq_options is None else belayq_options
        for given in (type(self).belayq_options, extra):
            if not isinstance(given, Mapping):
                raise ConfigError(
                    f"belayq_options must be a mapping of belayq.QueueConfig fields, got "
                    f"{given!r}"
                )
        self._lease_ms = lease_ms if lease_ms is not None else type(self).lease_ms
        self._max_deliveries = (
            max_deliveries if max_deliveries is not None else type(self).max_deliveries
        )
        self._belayq_options = {**type(self).belayq_options, **extra}
        core_options(self._lease_ms, self._max_deliveries, self._belayq_options)
        super().__init__(name, connection, *args, **kwargs)

    def belayq(self, connection: Any = None) -> ReliableQueue:
        """The core queue behind this RQ queue (on ``connection``, default its own)."""
        return core_for(
            connection if connection is not None else self.connection,
            self.name,
            self.key,
            lease_ms=self._lease_ms,
            max_deliveries=self._max_deliveries,
            options=self._belayq_options,
        )

    def push_job_id(
        self, job_id: str, pipeline: Any = None, at_front: bool = False
    ) -> None:
        """RQ's push of a job id to the queue's list, with the job counted as published in
        the same transaction (see :func:`~belayq_rq.claims.count_enqueued`)."""
        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        super().push_job_id(job_id, pipeline=pipe, at_front=at_front)
        count_enqueued(pipe, self.belayq(), job_id)
        if pipeline is None:
            pipe.execute()

    def empty(self) -> int:
        """Delete the queued jobs, as RQ's ``empty()`` does (their job hashes and dependents'
        lists go too), through belayq's purge, so what belayq keeps for each job (its trace
        context) goes with it: what ``belayq purge`` does. Jobs being run, and the jobs of
        RQ's registries (scheduled, failed ...), stay.

        Returns:
            How many jobs were removed from the queue, as RQ's ``empty()``.
        """
        purged, _ = purge_jobs(self.belayq(), delayed=False)
        return int(purged.ready)

    def delete(self, delete_jobs: bool = True) -> None:
        """Delete the queue, as RQ's ``delete()`` does (with its queued jobs when
        ``delete_jobs``), and every key belayq keeps for it, and its record in belayq's
        registry: what ``belayq drop`` does, so no tool lists it any more.

        Raises:
            BelayqError: A job of the queue is being run (claimed): nothing is deleted.
                Stop its workers first.
        """
        core = self.belayq()
        if core.stats()["in_flight"]:
            raise _busy(self.name, int(core.stats()["in_flight"]))
        if delete_jobs:
            self.empty()
        super().delete(delete_jobs=False)
        if not core.drop():  # a worker claimed a job meanwhile
            raise _busy(self.name, int(core.stats()["in_flight"]))

    def acquire_maintenance_lock(self) -> bool:
        _refuse_stock_worker(self, by_a_worker=True)  # only workers run maintenance passes
        return bool(super().acquire_maintenance_lock())

    @classmethod
    def dequeue_any(
        cls,
        queues: Iterable[RQQueue],
        timeout: int | None,
        connection: Redis,
        job_class: type[Job] | None = None,
        serializer: Serializer | str | None = None,
        death_penalty_class: type[BaseDeathPenalty] | None = None,
    ) -> tuple[Job, RQQueue] | None:
        """Claim the next job of the first non-empty queue (in the order given).

        Keeps RQ's contract: ``timeout=None`` does not wait and returns None when every
        queue is empty; a timeout > 0 waits (on all queues at once) and raises
        ``DequeueTimeout``; 0 raises ``ValueError``. An entry that is no loadable job (its
        hash is gone, or it is not a job id) goes to the core's dead-letter list with the
        reason, and the next one is claimed.

        A job claimed again after a lost attempt gets RQ's records of that attempt removed
        first; one that already lost ``max_deliveries`` attempts goes to the
        FailedJobRegistry instead of being returned (see :func:`_ready_to_run`).
        """
        _refuse_stock_worker(None, by_a_worker=death_penalty_class is not None)
        if timeout is not None and timeout == 0:
            raise ValueError(
                "RQ does not support indefinite timeouts. Please pick a timeout value > 0"
            )
        job_cls: type[Job] = job_class or cls.job_class
        rq_queues = [
            q
            if isinstance(q, cls)
            else cls(q.name, connection=connection, job_class=job_cls, serializer=serializer)
            for q in queues
        ]
        cores = [q.belayq(connection) for q in rq_queues]
        by_name = {q.name: (q, core) for q, core in zip(rq_queues, cores, strict=True)}
        while True:
            try:
                got = claim_any(cores, 0 if timeout is None else timeout)
            except ConnectionLost as exc:  # RQ's worker backs off and retries on these
                raise redis.ConnectionError(str(exc)) from exc
            if not got:
                if timeout is None:
                    return None
                raise DequeueTimeout(timeout, [q.key for q in rq_queues])
            queue, core = by_name[got[0].queue]
            job = _admit(queue, core, got[0], job_cls, serializer, death_penalty_class)
            if job is not None:
                return job, queue


def _busy(name: str, claimed: int) -> BelayqError:
    return BelayqError(
        f"queue {name!r} has {claimed} job(s) claimed by a worker, so belayq's keys of it "
        "were not deleted: stop its workers (`belayq inspect` shows the claims), then delete it"
    )


def purge_jobs(core: AnyQueue, *, delayed: bool) -> tuple[Purged, int]:
    """Delete ``core``'s waiting job ids through belayq's purge (with what belayq keeps for
    each), and their RQ job hashes and dependents' lists, as ``rq empty`` does; the delayed
    entries of the core too when ``delayed``. Returns the purge's counts and how many job
    keys were deleted."""
    client = core.client
    deleted = 0

    def delete_jobs(job_ids: list[bytes]) -> None:
        nonlocal deleted
        keys = [key for raw in job_ids for job_id in [raw.decode("utf-8", "replace")]
                for key in (Job.key_for(job_id), Job.dependents_key_for(job_id))]
        if keys:
            deleted += int(client.delete(*keys))

    return core.purge(delayed=delayed, on_entries=delete_jobs), deleted


def _admit(
    queue: Queue,
    core: ReliableQueue,
    delivery: Delivery,
    job_cls: type[Job],
    serializer: Serializer | str | None,
    death_penalty_class: type[BaseDeathPenalty] | None,
) -> Job | None:
    """The job to run for ``delivery``, or None when there is nothing to run (settled)."""
    claim = Claim(core, delivery)
    try:
        job = _load(core, delivery, job_cls, serializer)
        if job is None or not _ready_to_run(job, queue, claim, death_penalty_class):
            return None
    except Exception as exc:
        _hand_back(core, delivery, f"belayq_rq could not start the job: {exc!r}")
        if isinstance(exc, (ConnectionLost, redis.TimeoutError)):
            # RQ's dequeue loop retries a ConnectionError; a TimeoutError would stop the worker.
            raise redis.ConnectionError(str(exc)) from exc
        raise
    attach(job, claim)
    return job


def _ready_to_run(
    job: Job,
    queue: Queue,
    claim: Claim,
    death_penalty_class: type[BaseDeathPenalty] | None,
) -> bool:
    """Put RQ's records of a redelivered job right; False when it must not run again.

    A first delivery runs as RQ enqueued it. A redelivery (an attempt was lost) is, in RQ's
    terms: a job that ended after all (FINISHED, FAILED ...: its claim is acked), a job out
    of attempts (the core says ``exhausted``: it goes to the FailedJobRegistry), or a job to
    run again once the records of its lost attempts are gone.
    """
    delivery = claim.delivery
    if delivery.deliveries == 1:
        # A job enqueued through belayq_rq.Queue was counted then; one a stock RQ producer
        # pushed is counted as published here, at its first claim.
        claim.core.first_claimed(delivery, enqueued_ms(job.enqueued_at),
                                 published=not counted_at_enqueue(claim.core, job))
        return True
    if job.get_status(refresh=False) in settle.SETTLED:
        settle.ack_ended(job, claim)
        return False
    if delivery.exhausted:
        cause = "the worker stopped renewing the lease (killed, or cut off from Redis)"
        settle.fail_for_good(
            job, queue, claim, settle.lost_reason(claim, cause),
            death_penalty_class=death_penalty_class,
        )
        return False
    settle.forget_lost_attempts(job)
    log.warning(
        "job %s: redelivered (delivery %d of max %d) after a lost attempt",
        job.id, delivery.attempts, claim.core.config.max_deliveries,
    )
    return True


def enqueued_ms(at: datetime | None) -> float | None:
    """A job's ``enqueued_at`` as ms since the epoch (RQ stores UTC), or None."""
    if at is None:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return at.timestamp() * 1000


def _load(
    core: ReliableQueue,
    delivery: Delivery,
    job_cls: type[Job],
    serializer: Serializer | str | None,
) -> Job | None:
    """The job whose id ``delivery`` carries, or None when there is none to run: the entry
    is then dead-lettered in the core with the reason (it is no job RQ could fail).

    Raises:
        redis.ConnectionError, redis.TimeoutError: Redis unreachable (RQ's worker retries).
    """
    entry = delivery.payload  # the list entry itself: RQ's job id, however long
    shown = entry[:100].decode("ascii", "backslashreplace") + ("..." if len(entry) > 100 else "")
    try:
        return job_cls.fetch(entry.decode("ascii"), connection=core.client, serializer=serializer)
    except (redis.ConnectionError, redis.TimeoutError):
        raise
    except NoSuchJobError as exc:
        reason = (
            f"belayq_rq: no job hash for '{shown}': the job was deleted or its ttl ran out "
            f"before it ran, or the entry is not an RQ job id ({exc})"
        )
    except Exception as exc:  # not a valid id, or a hash RQ cannot read: never stop the worker
        reason = f"belayq_rq: cannot load job '{shown}': {exc!r}"
    log.error("dead-lettered an entry of %s: %s", core.name, reason)
    try:
        core.dead_letter(delivery, reason)
    except ConnectionLost:  # the core's lease keeper dead-letters it once Redis is back
        core.retry_later("dead", [delivery], reason)
    return None


def _hand_back(core: ReliableQueue, delivery: Delivery, reason: str) -> None:
    """Give a claim back now; if Redis cannot be reached, the core's lease keeper retries
    (``retry_later``); on any other error, stop extending its lease so the sweep brings it
    back."""
    try:
        core.nack(delivery, delay_ms=0, reason=reason)
    except ConnectionLost:
        core.retry_later("nack", [delivery], reason)
    except Exception:
        core.forget([delivery])


def _refuse_stock_worker(queue: Queue | None, by_a_worker: bool) -> None:
    """Refuse loudly when a worker that is not belayq's drives belayq queues.

    A stock ``rq.Worker`` given ``belayq_rq.Queue`` objects dequeues with RQ's own classmethod
    and never acks. belayq_rq's workers mark their dequeues and maintenance passes
    (:func:`~belayq_rq.claims.driving`); an unmarked maintenance pass, or an unmarked dequeue
    with ``death_penalty_class`` (which RQ's workers pass and direct callers do not), comes
    from a stock worker, and stops here before any job is taken.
    """
    if not by_a_worker or driven():
        return
    raise TypeError(
        f"a worker drives belayq_rq.Queue {queue.name if queue else ''!r} but is not a "
        "belayq_rq worker, so its jobs would never be acked: run `rq worker -w "
        "belayq_rq.Worker` (or belayq_rq.SimpleWorker); `rq worker-pool -w belayq_rq.Worker` "
        "works too. SpawnWorker is not supported."
    )
