"""Claims a closed channel kept because Celery was running their tasks (a connection blip),
settled once their tasks end (see :class:`Kept`)."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import celery_state

if TYPE_CHECKING:
    from .tags import Tags

log = logging.getLogger("belayq.kombu")


class Kept:
    """The tags of one table that a closed channel kept because Celery was running their
    tasks (a connection blip).

    They stay leased (extended by the keeper) until the task settles them. A claim whose
    task has ended without Celery settling it (Celery cancelled it, or, up to 5.6, lost
    its completion in the reconnect) is acked if its pool job succeeded and released
    otherwise; one nothing can tell about is released after ``blip_keep_max`` seconds, so
    it cannot stay leased for the life of the worker.

    Owned by the transport's :class:`Tags`; checked by the poller of whichever transport of
    the process runs next (the one Celery reconnected with), see :func:`check_kept`.
    """

    def __init__(self, tags: Tags) -> None:
        self._tags = tags
        self._deadlines: dict[Any, float] = {}
        self._jobs: dict[Any, Any] = {}  # the pool job of each kept tag (held alive here)
        self._suspects: set[Any] = set()
        self._lock = threading.Lock()

    def keep(self, jobs: Mapping[Any, Any], max_s: float) -> None:
        """Keep these tags, each with its pool job (None when there is none)."""
        deadline = time.monotonic() + max_s
        with self._lock:
            for tag, job in jobs.items():
                self._deadlines[tag] = deadline
                self._jobs[tag] = job

    def __len__(self) -> int:
        return len(self._deadlines)

    def check(self) -> None:
        """Settle kept claims whose task ended without Celery settling them (seen so at
        two checks in a row): ack after a success, release after a failure or once the
        claim has been kept for ``max_s``."""
        if not self._deadlines:
            return
        requests = celery_state.in_pool_requests()
        now = time.monotonic()
        with self._lock:
            items = [(tag, deadline, self._jobs.get(tag)) for tag, deadline in
                     self._deadlines.items()]
        for tag, deadline, job in items:
            if self._tags.get(tag) is None:  # settled the normal way
                self._drop(tag)
                continue
            if job is None and tag in requests:
                job = celery_state.pool_job(requests[tag])
            outcome: bool | None = False  # no job, no request: the task is gone
            if job is not None or tag in requests:
                outcome = celery_state.job_outcome(job)
            if outcome is None and now > deadline:
                outcome = False
            if outcome is None:
                self._suspects.discard(tag)
            elif tag not in self._suspects:
                self._suspects.add(tag)
            else:
                self._drop(tag)
                log.warning("the task of %s ended without Celery settling it; %s", tag,
                            "acking it" if outcome else "releasing it to run again")
                if outcome:
                    self._tags.ack(tag)
                else:
                    self._tags.release([tag])

    def _drop(self, tag: Any) -> None:
        with self._lock:
            self._deadlines.pop(tag, None)
            self._jobs.pop(tag, None)
            self._suspects.discard(tag)


#: The tag tables of this process's live transports (weakly): Celery's signals are
#: process-wide, and kept claims outlive the transport that closed under them.
ALL_TAGS: weakref.WeakSet[Tags] = weakref.WeakSet()


def check_kept() -> None:
    """Check the kept claims of every live transport of the process (the poller's sweep
    tick; after a blip, the closed transport's poller no longer runs)."""
    for tags in list(ALL_TAGS):
        tags.kept.check()
