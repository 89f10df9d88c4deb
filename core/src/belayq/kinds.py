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
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

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

    # Read by the metrics when present:
    # published_ms(queue, entry: bytes) -> float | None: when the ready list's entry was
    #     published (ms since the epoch), from what the framework keeps (one small read);
    # failed_count(queue) -> int: the size of the framework's own failed registry
    #     (see KindConsole).


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
