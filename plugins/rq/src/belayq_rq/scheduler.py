"""Stopping the scheduler process a worker started (``--with-scheduler``) without waiting
for ever.

RQ stops it with one SIGTERM and waits for it to end. The scheduler is a fork of the worker,
so until it installs its own signal handlers it has the worker's: a SIGTERM that arrives in
that window (a worker that ends right after it started its scheduler) is taken by the
worker's handler in the scheduler's process, the scheduler goes on, and the worker waits for
it for ever (when the worker's state is busy; otherwise the handler raises in the
scheduler's process). Here the signal is sent again until the scheduler ends (its loop
looks at its stop flag every ``interval``), a worker's handler run in the scheduler's
process does not try to stop the scheduler from inside, and a scheduler still running
after :data:`STOP_WAIT_S` is killed (its locks expire on their own).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from typing import Any

import rq.worker

log = logging.getLogger("belayq_rq")

#: How long a worker's teardown waits for its scheduler to stop before killing it (s).
STOP_WAIT_S = 10.0
#: How often the request to stop is sent again while the scheduler runs (s).
RESEND_EVERY_S = 1.0


class StopsItsScheduler(rq.worker.BaseWorker):
    """A worker whose teardown never hangs on its scheduler process (see the module doc)."""

    def stop_scheduler(self) -> None:
        process: Any = getattr(self.scheduler, "_process", None)
        if process is None or not process.pid:
            return
        if process is multiprocessing.current_process():
            return  # the worker's handler, inherited, run in the scheduler's own process
        deadline = time.monotonic() + STOP_WAIT_S
        while process.is_alive() and time.monotonic() < deadline:
            try:
                os.kill(process.pid, signal.SIGTERM)
            except OSError:
                break  # already gone
            process.join(RESEND_EVERY_S)
        if process.is_alive():
            log.warning("the scheduler process %s did not stop in %.0f s: killed (its locks "
                        "expire on their own)", process.pid, STOP_WAIT_S)
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.kill(process.pid, signal.SIGKILL)
        process.join()
