"""What the Celery adapter adds to belayq's tools for queues of kind ``kombu``: the failed
runs its workers record (:mod:`belayq.failures`), for the dashboard and the metrics.

Celery keeps a failure only in a result backend, if one is set; so the transport records
each failed run (the task, its arguments, the exception and its traceback) from the worker
that ran it. The dashboard lists, opens and deletes them. It does not requeue them: a Celery
task is retried by its own retry policy (``autoretry_for``, ``self.retry``), which knows
what may run twice; the tools have no Celery app to send a copy as.
"""

from __future__ import annotations

from typing import Any

from belayq import failures
from belayq.sharded import AnyQueue


class CeleryTools:
    """The dashboard's part for Celery's queues (see :class:`belayq.kinds.KindConsole`)."""

    def failed_count(self, queue: AnyQueue) -> int:
        return failures.count(queue)

    def failed(self, queue: AnyQueue, limit: int) -> list[dict[str, Any]]:
        return [{"id": r["id"], "task": r.get("task"), "failed_at_ms": r.get("failed_at_ms"),
                 "reason": r.get("reason")} for r in failures.newest(queue, limit)]

    def delete_failed(self, queue: AnyQueue, ids: list[str]) -> int:
        return failures.discard(queue, ids)

    def message(self, queue: AnyQueue, message_id: str) -> dict[str, Any] | None:
        """The record of task ``message_id``'s last failed run (None when none is kept)."""
        found = failures.get(queue, message_id)
        if found is None:
            return None
        return {**found, "status": "failed"}


TOOLS = CeleryTools()
