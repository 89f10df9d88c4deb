"""The link between RQ's objects and the core: one ReliableQueue per RQ queue and client,
and the claim a dequeued job carries to the code that settles it."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from rq.job import Job

from belayq import ConfigError, Delivery, QueueConfig, ReliableQueue
from belayq.keys import SCHEMA_VERSION
from belayq.option_names import refuse_unknown

_ATTR = "_belayq_claim"
#: Set by belayq_rq's workers while they dequeue and run maintenance (see :func:`driving`).
_DRIVER: ContextVar[object | None] = ContextVar("belayq_rq_driver", default=None)
_CACHE_ATTR = "_belayq_rq_cores"
_lock = threading.Lock()


@dataclass(frozen=True)
class Claim:
    """A job's current delivery and the core queue it came from.

    Attributes:
        core: The core queue behind the RQ queue the job was claimed from.
        delivery: The delivery: its fencing token and how many times the job was claimed.
    """

    core: ReliableQueue
    delivery: Delivery


@contextmanager
def driving(worker: object) -> Iterator[None]:
    """Mark the calls made inside as a belayq_rq worker's (its dequeues and maintenance)."""
    token = _DRIVER.set(worker)
    try:
        yield
    finally:
        _DRIVER.reset(token)


def driven() -> bool:
    """Whether a belayq_rq worker makes the current call (see :func:`driving`)."""
    return _DRIVER.get() is not None


def attach(job: Job, claim: Claim) -> None:
    """Let the job carry its claim into the work horse (a fork copies it)."""
    setattr(job, _ATTR, claim)


def claim_of(job: Job) -> Claim | None:
    """The claim a job was dequeued with, None when it did not come through belayq."""
    claim = getattr(job, _ATTR, None)
    return claim if isinstance(claim, Claim) else None


def core_for(
    client: Any,
    name: str,
    ready_key: str,
    *,
    lease_ms: int,
    max_deliveries: int,
    options: Mapping[str, Any],
) -> ReliableQueue:
    """The core queue whose ready list is RQ's own list ``ready_key``, built once per client.

    RQ pushes job ids to the right of its list and pops them from the left, so the core
    claims from the left end and the list entries are the job ids themselves. An RQ worker
    runs what it claims, so a claim counts as a started attempt (the core's default). RQ
    keeps its own failed registry, so a job that lost ``max_deliveries`` attempts comes back
    once more marked ``exhausted`` (the core's ``exhausted="deliver"``), and the adapter
    fails it there.
    """
    frozen = tuple(sorted(options.items()))
    cache_key = (ready_key, lease_ms, max_deliveries, frozen)
    # Kept on the client itself, so the queues go when the client goes (no global cache
    # holding clients alive).
    with _lock:
        cache: dict[Any, ReliableQueue] = vars(client).setdefault(_CACHE_ATTR, {})
        core = cache.get(cache_key)
        if core is None:
            core = ReliableQueue(client, name, ready_key=ready_key, kind="rq",
                                 **core_options(lease_ms, max_deliveries, options))
            cache[cache_key] = core
        return core


#: The field of an RQ job's hash that marks it counted as published at its enqueue (through
#: :class:`belayq_rq.Queue`); its first claim removes it instead of counting the job again.
COUNTED_FIELD = "belayq_published"


def count_enqueued(pipe: Any, core: ReliableQueue, job_id: str) -> None:
    """Queue on ``pipe`` (RQ's own enqueue transaction) the count of job ``job_id`` as
    published: one increment of the queue's ``published`` counter (a transient queue counts
    nothing), and the job's mark (:data:`COUNTED_FIELD`) so its first claim does not count
    it again."""
    if core.config.transient:
        return
    pipe.hincrby(core.keys.stats, "published", 1)
    pipe.hsetnx(core.keys.stats, "schema", SCHEMA_VERSION)  # as the core's counters do
    pipe.hset(Job.key_for(job_id), COUNTED_FIELD, 1)


def counted_at_enqueue(core: ReliableQueue, job: Job) -> bool:
    """Whether ``job`` was counted as published at its enqueue; removes the mark, so a later
    push by a stock RQ producer (``rq requeue``) is counted at its claim again."""
    return bool(core.client.hdel(job.key, COUNTED_FIELD))


def flush_observations(client: Any) -> None:
    """Write what the core queues built on ``client`` observed for the metrics (the jobs
    counted as published at their first claim, queue waits, failed runs): a burst worker
    ends before its lease keeper's next beat would write them."""
    with _lock:
        cores = list(vars(client).get(_CACHE_ATTR, {}).values())
    for core in cores:
        core.flush_observations()


#: QueueConfig fields belayq_rq sets itself: RQ's list layout (one list of job ids, no
#: priority levels), and how RQ counts attempts.
FIXED_OPTIONS: dict[str, Any] = {
    "priority_steps": (0,),
    "payload_in_list": True,
    "ready_head": "left",
    "exhausted": "deliver",
    "claim_starts": True,
}


def core_options(lease_ms: Any, max_deliveries: Any, options: Any) -> dict[str, Any]:
    """The core queue options of an RQ queue, checked: ``options`` (``belayq_options``)
    may hold any :class:`~belayq.QueueConfig` field but the ones belayq_rq sets itself.

    Raises:
        ConfigError: ``options`` is no mapping, names an unknown or a fixed field, or a
            value (``lease_ms`` and ``max_deliveries`` included) is out of range.
    """
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"belayq_options must be a mapping of belayq.QueueConfig fields, got {options!r}"
        )
    valid = {f.name for f in dataclasses.fields(QueueConfig)}
    refuse_unknown(set(options) - valid, valid - _OWN - set(FIXED_OPTIONS),
                   what="belayq_rq belayq_options key")
    own = sorted(_OWN & set(options))
    if own:
        raise ConfigError(
            f"belayq_options may not set {own}: pass them as belayq_rq.Queue's own "
            "keywords or class attributes (lease_ms=..., max_deliveries=...)"
        )
    fixed = sorted(set(FIXED_OPTIONS) & set(options))
    if fixed:
        raise ConfigError(
            f"belayq_options may not set {fixed}: belayq_rq sets them to fit RQ's lists and "
            f"workers ({', '.join(f'{k}={FIXED_OPTIONS[k]!r}' for k in fixed)})"
        )
    out = {**dict(options), **FIXED_OPTIONS, "lease_ms": lease_ms,
           "max_deliveries": max_deliveries}
    QueueConfig(**out)  # checks every value, raising ConfigError
    return out


_OWN = {"lease_ms", "max_deliveries"}
