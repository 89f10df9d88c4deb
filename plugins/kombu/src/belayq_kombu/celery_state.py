"""Everything belayq:// reads of a running Celery worker, in one place.

The transport only translates kombu's calls, but three decisions need to know what the
Celery worker in this process is doing:

* which delivered messages a pool has accepted (their runs count as attempts) or has begun
  writing to a child (on a connection blip their claims are kept, not released, and
  billiard is made to keep tracking them);
* how many prefetched tasks still wait for a pool process (claim in batches meanwhile);
* whether the pool job of a task whose completion Celery lost in a reconnect succeeded;
* and one write: a revoke that Redis remembers for a delayed task, added to the worker's own
  revoked set just before the task is handed over, so that Celery itself drops it.

Celery offers no public API for the first and last, so this module reads
``celery.worker.state`` (``active_requests``, ``reserved_requests``) and a request's
billiard ApplyResult (``Request._apply_result``: ``_accepted``, ``_write_to``; it sets
``_accepted`` on a blip, see :func:`keep_written_jobs`), and connects to the public
``task_prerun`` signal. It is written against Celery 5.3 to 5.7 (the versions the tox
matrix runs). Outside a Celery worker every function answers "nothing is running".
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

#: The Celery versions whose worker state this module reads (tox.ini runs each).
SUPPORTED_CELERY = ">=5.3,<5.8"


def _worker_state() -> Any:
    """``celery.worker.state`` if a Celery worker runs in this process (imported by it)."""
    return sys.modules.get("celery.worker.state")


def control_panel() -> Any:
    """Celery's worker remote-control module (``celery.worker.control``: its ``Panel`` and
    ``inspect_command``), for the ``scheduled`` reply belayq:// extends; None when Celery's
    worker is not installed."""
    try:
        from celery.worker import control  # type: ignore[import-untyped]
    except ImportError:
        return None
    return control


def request_class() -> Any:
    """Celery's worker ``Request``, which builds a ``scheduled`` entry as the worker does for
    a task it holds."""
    from celery.worker.request import Request  # type: ignore[import-untyped]

    return Request


def in_worker() -> bool:
    """Whether a Celery worker runs in this process."""
    return _worker_state() is not None


def running_requests() -> dict[Any, Any]:
    """Delivery tag -> request, for the tasks a Celery worker in this process is running.

    Empty outside a Celery worker. Celery keeps a task's request in
    ``celery.worker.state.active_requests`` from the moment a pool accepted it until it
    is done; the request holds the kombu message.
    """
    state = _worker_state()
    if state is None:
        return {}
    out = {}
    for request in list(getattr(state, "active_requests", ())):
        tag = getattr(getattr(request, "_message", None), "delivery_tag", None)
        if tag is not None:
            out[tag] = request
    return out


def _written_job(request: Any) -> Any:
    """The billiard job of a request that the pool has begun writing to a child and that no
    child has accepted yet; None otherwise."""
    ref = getattr(request, "_apply_result", None)
    job = ref() if callable(ref) else ref
    if job is None or getattr(job, "_accepted", True) or getattr(job, "_write_to", None) is None:
        return None
    return job


def in_pool_requests() -> dict[Any, Any]:
    """Delivery tag -> request, for the tasks the pool runs or will run: the running ones
    (:func:`running_requests`), and those billiard has begun writing to a pool child that
    has not accepted them yet. A child runs what was written to it, even when Celery, on a
    lost connection, forgets the request (``Consumer.on_close``: ``pool.flush()``)."""
    out = running_requests()
    state = _worker_state()
    for request in list(getattr(state, "reserved_requests", ())):
        tag = getattr(getattr(request, "_message", None), "delivery_tag", None)
        if tag is not None and tag not in out and _written_job(request) is not None:
            out[tag] = request
    return out


def keep_written_jobs(requests: Iterable[Any]) -> int:
    """Make Celery's reconnect keep the pool jobs of these requests that are written to a
    child but not accepted: billiard's ``flush`` drops such a job from its table while the
    child still runs it, so its end would go unseen (no ack: the message would come back
    and run twice). A job marked accepted stays in the table, and its end is reported (and
    acked) as any other's. Returns how many were marked."""
    marked = 0
    for request in requests:
        job = _written_job(request)
        if job is not None:
            job._accepted = True
            job._belayq_written_to = job._write_to  # see _lost_in_pipe
            marked += 1
    return marked


def running_tags() -> set[Any]:
    """Delivery tags of the tasks a Celery worker in this process is running right now."""
    return set(running_requests())


def pool_job(request: Any) -> Any:
    """A request's pool job (billiard's ApplyResult), or None (solo and threads pools, or a
    job already gone)."""
    ref = getattr(request, "_apply_result", None)
    return ref() if callable(ref) else ref


def job_outcome(job: Any) -> bool | None:
    """Whether a pool job succeeded, once it is done; None while it runs or when nothing
    can tell. False too for a job that never ran and never will: written to a child that
    died before taking it (:func:`_lost_in_pipe`).

    Celery up to 5.6 loses the completion of jobs that were running when the broker
    connection was lost: the request stays "active" forever and is never acked. Its pool
    job, kept from the moment of the blip, says how it ended.
    """
    if job is None:
        return None
    try:
        if job.ready():
            return bool(job.successful())
        return False if _lost_in_pipe(job) else None
    except Exception:
        return None


def _lost_in_pipe(job: Any) -> bool:
    """Whether a job not done was written to a pool child that died before accepting it.

    After a blip Celery's ``pool.flush()`` forgets which children are busy, so the next
    task may be written to the pipe of a child still running a long task; a blip then
    keeps it (:func:`keep_written_jobs` marks it accepted). If that child dies, billiard
    never reports the job lost (no child accepted it), and what it does with it next is
    not to be relied on (seen: begun again on the new child and never finished): it would
    stay "running", and its claim leased, until ``blip_keep_max``. The child checked is the
    one the job was written to when it was kept.
    """
    if getattr(job, "_worker_pid", None):
        return False  # a child took it: billiard reports its end, or its loss
    proc = getattr(job, "_belayq_written_to", None) or getattr(job, "_write_to", None)
    is_alive = getattr(proc, "_is_alive", None)
    return callable(is_alive) and not is_alive()


def prefetched_waiting() -> int:
    """How many tasks this worker has received and not yet handed to a pool process (0
    outside a Celery worker)."""
    state = _worker_state()
    if state is None:
        return 0
    return len(state.reserved_requests) - len(state.active_requests)


def remember_revoked(task_ids: set[str]) -> bool:
    """Add ``task_ids`` to this worker's revoked set, as ``celery control revoke`` does in
    every worker that hears it (``celery.worker.state.revoked``); False outside a worker."""
    state = _worker_state()
    revoked = getattr(state, "revoked", None)
    if revoked is None:
        return False
    for task_id in task_ids:
        revoked.add(task_id)
    return True


def on_task_prerun(handler: Callable[..., None]) -> None:
    """Call ``handler(task=..., task_id=...)`` when a task is about to run in this process,
    before its body (Celery's ``task_prerun``: in a prefork pool, in the child that runs it;
    connected before the pool forks, the children inherit the handler)."""
    try:
        from celery.signals import task_prerun  # type: ignore[import-untyped]
    except ImportError:  # kombu without Celery
        return
    task_prerun.connect(handler, weak=False, dispatch_uid="belayq-task-prerun")


def on_task_failure(handler: Callable[..., None]) -> None:
    """Call ``handler(sender=task, ...)`` when a task raised, in the process that ran it
    (Celery's ``task_failure``: in a prefork pool, in the child; while the task's request,
    with the message's properties, is still current). Not for a retry (``Retry``)."""
    try:
        from celery.signals import task_failure
    except ImportError:  # kombu without Celery
        return
    task_failure.connect(handler, weak=False, dispatch_uid="belayq-task-failure")
