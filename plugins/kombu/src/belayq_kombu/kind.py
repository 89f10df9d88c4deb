"""What the Celery adapter adds to belayq's tools for queues of kind ``kombu``: the failed
runs its workers record (:mod:`belayq.failures`), for the dashboard and the metrics.

Celery keeps a failure only in a result backend, if one is set; so the transport records
each failed run (the task, its arguments, the exception and its traceback) from the worker
that ran it. The dashboard lists, opens and deletes them. It does not requeue them: a Celery
task is retried by its own retry policy (``autoretry_for``, ``self.retry``), which knows
what may run twice; the tools have no Celery app to send a copy as.
"""

from __future__ import annotations

from belayq.failures import RecordedFailures

#: The dashboard's part for Celery's queues (see :class:`belayq.kinds.KindConsole`).
TOOLS = RecordedFailures()
