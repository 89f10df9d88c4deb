"""Everything belayq:// reads of a running Celery worker, in one place.

The transport only translates kombu's calls, but three decisions need to know what the
Celery worker in this process is doing:

* which delivered messages a pool has accepted (their runs count as attempts; on a
  connection blip their claims are kept, not released);
* how many prefetched tasks still wait for a pool process (claim in batches meanwhile);
* whether the pool job of a task whose completion Celery lost in a reconnect succeeded;
* and one write: a revoke that Redis remembers for a delayed task, added to the worker's own
  revoked set just before the task is handed over, so that Celery itself drops it.

Celery offers no public API for the first and last, so this module reads
``celery.worker.state`` (``active_requests``, ``reserved_requests``) and a request's
billiard ApplyResult (``Request._apply_result``), and connects to the public
``task_prerun`` signal. It is written against Celery 5.3 to 5.7 (the versions the tox
matrix runs). Outside a Celery worker every function answers "nothing is running".
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

#: The Celery versions whose worker state this module reads (tox.ini runs each).
SUPPORTED_CELERY = ">=5.3,<5.8"


def _worker_state() -> Any:
    """``celery.worker.state`` if a Celery worker runs in this process (imported by it)."""
    return sys.modules.get("celery.worker.state")


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


def running_tags() -> set[Any]:
    """Delivery tags of the tasks a Celery worker in this process is running right now."""
    return set(running_requests())


def pool_outcome(request: Any) -> bool | None:
    """Whether a running request's pool job succeeded, once it is done; None while it runs
    or when nothing can tell.

    Celery up to 5.6 loses the completion of jobs that were running when the broker
    connection was lost: the request stays "active" forever and is never acked. Its pool
    job (billiard's ApplyResult), while it still exists, says how it ended.
    """
    ref = getattr(request, "_apply_result", None)
    job = ref() if callable(ref) else ref
    if job is None:
        return None
    try:
        return bool(job.successful()) if job.ready() else None
    except Exception:
        return None


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
    """Call ``handler(task_id=...)`` when a task starts in this process (solo and threads
    pools; a prefork child's starts reach its main process through ``running_tags``)."""
    try:
        from celery.signals import task_prerun  # type: ignore[import-untyped]
    except ImportError:  # kombu without Celery
        return
    task_prerun.connect(handler, weak=False, dispatch_uid="belayq-task-prerun")
