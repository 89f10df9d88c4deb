"""RQ jobs on belayq in the trace that enqueued them (``belayq[otel]``).

:class:`belayq.otel.BelayqInstrumentor` loads this module through the ``belayq.otel``
entry point when it instruments; nothing here runs otherwise. RQ producers push job ids
with RQ's own code, so belayq traces them where RQ enqueues:

* every enqueue (``enqueue``, ``enqueue_many``, a retry, a dependent, the scheduler's) is a
  ``send <queue>`` span (PRODUCER). On a queue a belayq worker takes jobs from (a
  ``belayq_rq.Queue``, or a stock ``rq.Queue`` whose queue is in belayq's registry), its
  context is kept with the job as a core publish keeps it (a field of the queue's meta
  hash, deleted when the job's message goes), written in RQ's own transaction: the one RQ
  enqueues in, or the one it would have opened, so it takes no connection of its own (a
  unique enqueue writes it just before RQ's script, and only where the job has none yet:
  a refused duplicate leaves the waiting job's context alone); a job removed from its
  queue by RQ (``cancel``, ``delete``) takes its context with it. A stock queue no belayq
  worker serves gets its span only: nothing is written to Redis for it, as nothing would
  take it away;
* a belayq worker's claim is the core's ``receive <queue>`` span, linked to it, and the job
  runs inside a ``process <queue>`` span (CONSUMER) of that trace, in the work horse of a
  forking worker too, so the spans a job makes join the trace that enqueued it. A job that
  raises leaves it with status ERROR. A work horse exports its spans before it exits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from rq.queue import Queue
from rq.worker import Worker

from belayq.constants import TRACE_CONTEXT_MAX_BYTES
from belayq.keys import QueueKeys
from belayq.models import entry_id
from belayq.otel import SYSTEM, context_of
from belayq.registry import Registry

from .claims import claim_of
from .queue import Queue as BelayqQueue


def _owner(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO that defines ``name`` (where to wrap it)."""
    return next(c for c in cls.__mro__ if name in vars(c))


def _base(queue_name: str, operation: str) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue_name,
            "messaging.operation.type": operation, "messaging.operation.name": operation}


def _keys(queue: Any, job_id: str) -> tuple[QueueKeys, str]:
    """The keys of RQ queue ``queue`` as belayq lays it out, and the meta field of job
    ``job_id``'s trace context."""
    keys = QueueKeys.build(queue.name, ready_key=queue.key)
    return keys, keys.context_field(entry_id(job_id.encode("utf-8"), inline=True))


def _served(queue: Any, pipeline: Any) -> bool:
    """Whether a belayq worker takes ``queue``'s jobs, and so their contexts away with them:
    a ``belayq_rq.Queue``, or a stock queue whose queue is in belayq's registry (one read, on
    ``pipeline``'s connection while it watches keys, so no second connection is taken)."""
    if isinstance(queue, BelayqQueue):
        return True
    reader = pipeline if pipeline is not None and getattr(pipeline, "watching", False) \
        else queue.connection
    return Registry(reader).get("rq", queue.name) is not None


def _keep(client: Any, queue: Any, job_id: str, value: str) -> None:
    """Keep ``value`` (a context, as ``tracing.context_value()`` gives it) as job
    ``job_id``'s, on ``client`` (a pipeline: with the job), as the publish script keeps
    a message's: one it would not keep is counted in ``untraced`` instead."""
    keys, field = _keys(queue, job_id)
    if len(value) <= TRACE_CONTEXT_MAX_BYTES and value != "{}":
        client.hset(keys.meta, field, value)
    else:
        client.hincrby(keys.stats, "untraced", 1)


def _forget(client: Any, queue: Any, job_id: str) -> None:
    keys, field = _keys(queue, job_id)
    client.hdel(keys.meta, field)


def _enqueue_unique(enqueue: Callable[..., Any], queue: Any, job: Any, value: str,
                    pipeline: Any, *args: Any, **kwargs: Any) -> Any:
    """RQ's unique enqueue (its own script stores the job, so the context goes first), with
    ``value`` kept as the job's context. The context is written only where the job has none
    (HSETNX), and only a context this call wrote is removed when RQ refuses the job: a
    refused duplicate leaves the waiting job's context as it is."""
    keys, field = _keys(queue, job.id)
    if len(value) > TRACE_CONTEXT_MAX_BYTES or value == "{}":
        done = enqueue(queue, job, pipeline, *args, **kwargs)
        queue.connection.hincrby(keys.stats, "untraced", 1)
        return done
    wrote = bool(queue.connection.hsetnx(keys.meta, field, value))
    try:
        return enqueue(queue, job, pipeline, *args, **kwargs)
    except BaseException:
        if wrote:
            queue.connection.hdel(keys.meta, field)
        raise


def install(tracing: Any) -> Callable[[], None]:
    """Turn the tracing of RQ jobs on (``tracing``: belayq.otel's instrumentation); returns
    what turns it off."""
    tracer: trace.Tracer = tracing.tracer
    enqueue_owner = _owner(Queue, "_enqueue_job")
    perform_owner = _owner(Worker, "perform_job")
    enqueue = vars(enqueue_owner)["_enqueue_job"]
    remove_owner = _owner(Queue, "remove")
    remove = vars(remove_owner)["remove"]
    perform = vars(perform_owner)["perform_job"]

    @functools.wraps(enqueue)
    def traced_enqueue(queue: Any, job: Any, pipeline: Any = None, *args: Any,
                       **kwargs: Any) -> Any:
        attributes = _base(queue.name, "send")
        attributes["messaging.operation.name"] = "publish"
        attributes["messaging.message.id"] = job.id
        with tracer.start_as_current_span(f"send {queue.name}", kind=SpanKind.PRODUCER,
                                          attributes=attributes):
            value = tracing.context_value()
            if (not value or not getattr(queue, "_is_async", True)  # a sync job never waits
                    or not _served(queue, pipeline)):  # nothing would take the context away
                return enqueue(queue, job, pipeline, *args, **kwargs)
            unique = kwargs.get("unique", args[1] if len(args) > 1 else False)
            if unique:
                return _enqueue_unique(enqueue, queue, job, value, pipeline, *args, **kwargs)
            pipe = pipeline if pipeline is not None else queue.connection.pipeline()
            _keep(pipe, queue, job.id, value)
            done = enqueue(queue, job, pipe, *args, **kwargs)
            if pipeline is None:
                pipe.execute()
            return done

    @functools.wraps(remove)
    def traced_remove(queue: Any, job_or_id: Any, pipeline: Any = None) -> Any:
        job_id = str(getattr(job_or_id, "id", job_or_id))
        if pipeline is not None:
            _forget(pipeline, queue, job_id)
            return remove(queue, job_or_id, pipeline)
        with queue.connection.pipeline() as pipe:
            remove(queue, job_or_id, pipe)
            _forget(pipe, queue, job_id)
            return pipe.execute()[0]

    @functools.wraps(perform)
    def traced_perform(worker: Any, job: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
        claim = claim_of(job)
        if claim is None:  # not claimed through belayq
            return perform(worker, job, queue, *args, **kwargs)
        attributes = _base(queue.name, "process")
        attributes.update({"messaging.message.id": job.id,
                           "belayq.delivery": claim.delivery.deliveries,
                           "belayq.attempt": claim.delivery.attempts,
                           "rq.job.func_name": str(job.func_name)})
        span = tracer.start_span(f"process {queue.name}", context=context_of(claim.delivery),
                                 kind=SpanKind.CONSUMER, attributes=attributes)
        try:
            with trace.use_span(span, end_on_exit=False):
                done = perform(worker, job, queue, *args, **kwargs)
            if not done:
                info = job.latest_result() if hasattr(job, "latest_result") else None
                span.set_status(Status(StatusCode.ERROR, str(getattr(info, "exc_string", "")
                                                               or "the job failed")[-500:]))
            return done
        finally:
            span.end()
            if getattr(worker, "_is_horse", False):  # exits with os._exit: export now
                flush = getattr(tracing.provider, "force_flush", None)
                if flush is not None:
                    flush()

    setattr(enqueue_owner, "_enqueue_job", traced_enqueue)  # noqa: B010
    setattr(perform_owner, "perform_job", traced_perform)  # noqa: B010
    setattr(remove_owner, "remove", traced_remove)  # noqa: B010

    def undo() -> None:
        setattr(enqueue_owner, "_enqueue_job", enqueue)  # noqa: B010
        setattr(perform_owner, "perform_job", perform)  # noqa: B010
        setattr(remove_owner, "remove", remove)  # noqa: B010

    return undo
