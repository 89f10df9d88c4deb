"""What the Celery adapter adds to belayq's tools for queues of kind ``kombu``: the failed
runs its workers record (:mod:`belayq.failures`), for the dashboard and the metrics.

Celery keeps a failure only in a result backend, if one is set; so the transport records
each failed run (the task, its arguments, the exception and its traceback) from the worker
that ran it. The dashboard lists, opens and deletes them. It does not requeue them: a Celery
task is retried by its own retry policy (``autoretry_for``, ``self.retry``), which knows
what may run twice; the tools have no Celery app to send a copy as.

Search finds a Celery message by its task id (the envelope's ``id`` header), read here.
"""

from __future__ import annotations

import json

from belayq.failures import RecordedFailures


class KombuTools(RecordedFailures):
    """The tools' Celery-specific work: its failed runs (:class:`RecordedFailures`), and
    the task id inside a message, by which search finds it."""

    def ids_of(self, payload: bytes) -> list[str]:
        """The Celery task id of a kombu envelope (its ``id`` header), as a list (empty when
        the payload is no envelope or names no id)."""
        try:
            envelope = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return []
        headers = envelope.get("headers") if isinstance(envelope, dict) else None
        found = headers.get("id") if isinstance(headers, dict) else None
        return [found] if isinstance(found, str) and found else []


#: The dashboard's part for Celery's queues (see :class:`belayq.kinds.KindConsole`).
TOOLS = KombuTools()
