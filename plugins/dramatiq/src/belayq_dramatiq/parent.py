"""A ``dramatiq`` worker process that outlives its main process exits.

The ``dramatiq`` command runs its workers in child processes. When its main process is
killed (``kill -9`` of its pid), the children live on as orphans: they keep claiming and
running, and their log lines go to a pipe nobody reads any more, so once its buffer is full
every thread that logs blocks. The lease keeper, which never logs, would keep such a
process's claims alive with nothing running them. So a worker process watches its parent
from its boot on (``process_boot``, which the command emits in each worker process) and
exits at once when the parent is gone: its claims come back within the lease, as after a
``kill -9`` of the whole command.
"""

from __future__ import annotations

import logging
import os
import threading

import dramatiq
from dramatiq.middleware import Middleware

log = logging.getLogger("belayq_dramatiq")

#: How often a worker process looks at its parent (s).
WATCH_EVERY_S = 1.0


class ParentWatch(Middleware):
    """Exits a worker process whose parent (the ``dramatiq`` main process) died."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        parent = os.getppid()
        threading.Thread(target=self._watch, args=(parent,), name="belayq-parent-watch",
                         daemon=True).start()

    def stop(self) -> None:
        """Stop watching (the broker closes)."""
        self._stop.set()

    def _watch(self, parent: int) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            if os.getppid() != parent:
                # No logging: the log pipe to the dead parent may be full.
                os._exit(1)
