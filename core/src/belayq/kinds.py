"""What a framework's adapter adds to belayq's tools for the queues of its kind.

The core knows where a framework's queue keeps its messages (its lists), but not what the
framework keeps beside them: RQ's job hashes and its scheduled-job registry, for example.
An adapter that keeps such things registers an object under the entry point group
``belayq.kinds``, named after its kind (``belayq_rq``: ``rq = "belayq_rq.kind:TOOLS"``), and
the tools (``belayq purge``, ``belayq delayed``, the dashboard) call it for the queues of that
kind. A kind with no such entry point is handled by the core alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ConfigError

if TYPE_CHECKING:
    from .sharded import AnyQueue

log = logging.getLogger("belayq")

GROUP = "belayq.kinds"


class KindTools(Protocol):
    """A framework's part of the tools' work on a queue of its kind (each method optional:
    the tools call those present)."""

    def purge(self, queue: AnyQueue, *, delayed: bool) -> dict[str, int]:
        """Delete the queue's waiting messages as the framework's own purge would (with
        what the framework keeps for each), and its delayed ones too when ``delayed``.
        Returns counts by what was deleted."""
        ...

    def delayed(self, queue: AnyQueue, limit: int) -> list[dict[str, Any]]:
        """Rows for the messages the framework holds back itself (its own scheduler's),
        soonest first: ``id``, ``due_in_s`` and what describes the message."""
        ...

    # Read by the numbers every tool shows (belayq.readmodel) when present:
    # framework_counts(queue) -> dict: ``delayed``, the messages the framework holds back
    #     itself (RQ's scheduled jobs), and ``failed``, the failed jobs it keeps (None for
    #     none); without it, ``failed`` is failed_count(queue) when present;
    # failed_runs_dead_lettered (bool attribute): a message's last failed run is
    #     dead-lettered rather than acked (Dramatiq's), for the history's completed runs;
    # published_ms(queue, entry: bytes) -> float | None: when the ready list's entry was
    #     published (ms since the epoch), from what the framework keeps (one small read);
    # failed_count(queue) -> int: the size of the framework's own failed registry
    #     (see KindConsole).
    # Read by search (belayq.lookup) when present:
    # ids_of(payload: bytes) -> list[str]: the framework's own ids of the message a payload
    #     (or a list entry that is the payload) holds, as a Celery task id in its envelope.


class KindConsole(Protocol):
    """What an adapter may add for the dashboard, when its framework keeps failures and
    job records of its own (each method optional: the dashboard asks for those present)."""

    def failed_count(self, queue: AnyQueue) -> int:
        """How many failed jobs the framework keeps for the queue."""
        ...

    def failed(self, queue: AnyQueue, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` of them: ``id``, ``task``, ``failed_at_ms``, ``reason``."""
        ...

    def retry_failed(self, queue: AnyQueue, ids: list[str]) -> int:
        """Requeue failed jobs as the framework would; how many were requeued (absent: the
        dashboard offers no requeue, and says why)."""
        ...

    def delete_failed(self, queue: AnyQueue, ids: list[str]) -> int:
        """Delete failed jobs as the framework would; how many were deleted."""
        ...

    def message(self, queue: AnyQueue, message_id: str) -> dict[str, Any] | None:
        """The framework's record of a message (None when it has none)."""
        ...


#: Kinds whose framework keeps a record per message beside the list: their purge needs the
#: adapter, and is refused without it.
FRAMEWORK_PURGE = {"rq": "the job hashes, as `rq empty` does"}


def purge(queue: AnyQueue, *, delayed: bool,
          on_batch: Callable[[int], Any] | None = None) -> dict[str, int]:
    """Delete the waiting messages of ``queue`` as its framework's own purge would: the one
    purge every tool runs (``belayq purge``, the dashboard). A kind whose adapter registered
    a ``purge`` has it do the work (RQ's job hashes go with their ids, as ``rq empty``
    does); any other kind's messages are deleted by the core.

    Args:
        queue: The queue, opened as recorded.
        delayed: Delete the delayed messages too (and a framework's own scheduled ones).
        on_batch: Called with the count so far after each batch (the core's purge).

    Returns:
        Counts by what was deleted: ``ready`` and ``delayed``, and what the adapter adds.

    Raises:
        ConfigError: A kind that keeps a record per message whose adapter is not installed
            (nothing is deleted).
    """
    kind = queue.kind
    own = getattr(tools_for(kind), "purge", None)
    if own is not None:
        return dict(own(queue, delayed=delayed))
    if kind in FRAMEWORK_PURGE:
        raise ConfigError(f"purging a queue of kind {kind} deletes what its framework keeps "
                          f"beside it ({FRAMEWORK_PURGE[kind]}): install its adapter "
                          f"(pip install belayq-{kind}) to purge it")
    purged = queue.purge(on_batch=on_batch, delayed=delayed)
    return {"ready": purged.ready, "delayed": purged.delayed}


def can_purge_itself(kind: str) -> bool:
    """Whether the adapter of ``kind`` purges its queues (it may delete what no count of
    belayq's shows, as RQ's scheduled jobs)."""
    return getattr(tools_for(kind), "purge", None) is not None


def console_for(kind: str) -> KindConsole | None:
    """The adapter's dashboard part for ``kind`` (see :class:`KindConsole`), or None."""
    tools = tools_for(kind)
    return tools if hasattr(tools, "failed_count") else None  # type: ignore[return-value]


@functools.cache
def tools_for(kind: str) -> KindTools | None:
    """The tools the adapter of ``kind`` registered, or None (or when it fails to load,
    which is logged: the core's own handling is used then)."""
    for entry in metadata.entry_points(group=GROUP):
        if entry.name == kind:
            try:
                found: KindTools = entry.load()
            except Exception as exc:  # a broken adapter must not break the tools
                log.warning("cannot load the belayq tools of kind %r (%s): %s", kind,
                            entry.value, exc)
                return None
            return found
    return None
