"""The lease keeper: one daemon thread per process that keeps the leases it holds alive.

Every queue that claimed something registers here. Each tick the keeper extends the leases
of every delivery the queue still holds (one script call per queue) and runs the queue's
guarded sweep, so expired leases anywhere in the fleet come back within one sweep period.

The thread needs the GIL for a few microseconds per tick. Pure-Python CPU-bound work
yields it every ``sys.getswitchinterval()`` (5 ms), so the keeper keeps up; a C extension
that holds the GIL for longer than the lease (a single huge regex, a numpy call that does
not release it) starves every Python thread, and then the lease can expire. Such work
should run in a child process, as RQ's work horse and Celery's prefork pool already do.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Protocol

log = logging.getLogger("belayq.lease")


class KeptQueue(Protocol):
    """What the keeper needs from a queue."""

    def heartbeat(self) -> None: ...

    @property
    def heartbeat_ms(self) -> int: ...


class LeaseKeeper:
    """Runs ``heartbeat()`` of every registered queue at its own period."""

    def __init__(self) -> None:
        self._queues: weakref.WeakSet[KeptQueue] = weakref.WeakSet()
        self._due: weakref.WeakKeyDictionary[KeptQueue, float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    def register(self, queue: KeptQueue) -> None:
        """Keep ``queue``'s leases from now on (cheap when it is already kept)."""
        if queue in self._queues and self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            self._queues.add(queue)
            self._due.setdefault(queue, time.monotonic() + queue.heartbeat_ms / 1000)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="belayq-lease-keeper", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def unregister(self, queue: KeptQueue) -> None:
        with self._lock:
            self._queues.discard(queue)
            self._due.pop(queue, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                queues = list(self._queues)
            now = time.monotonic()
            next_at = now + 1.0
            for q in queues:
                due = self._due.get(q, now)
                if due <= now:
                    try:
                        q.heartbeat()
                    except Exception:  # a Redis blip must not kill the keeper
                        log.warning(
                            "lease heartbeat failed; retrying",
                            exc_info=log.isEnabledFor(logging.DEBUG),
                        )
                    due = time.monotonic() + q.heartbeat_ms / 1000
                    with self._lock:
                        if q in self._queues:
                            self._due[q] = due
                next_at = min(next_at, due)
            self.ticks += 1
            self._wake.wait(max(0.0, next_at - time.monotonic()))
            self._wake.clear()

    def _after_fork(self) -> None:
        # The thread does not survive a fork; a child that claims starts its own.
        self._queues = weakref.WeakSet()
        self._due = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None


KEEPER = LeaseKeeper()
os.register_at_fork(after_in_child=KEEPER._after_fork)
