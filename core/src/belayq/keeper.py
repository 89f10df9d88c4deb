"""The lease keeper: a daemon thread per kept queue that keeps the process's leases alive.

Every queue that claims registers here. Its thread beats every ``heartbeat_ms``, measured
from the start of one beat to the start of the next: it extends the leases of every delivery
the queue still holds (one script call), then retries its settlements that could not reach
Redis, then runs the queue's sweep, so expired leases anywhere in the fleet come back within
one sweep period. One thread per queue, so a queue whose Redis no longer answers stalls only
its own heartbeat, never another's. The beat waits on nothing but Redis's answers to those
calls: the primary of a Sentinel-managed client is looked up off the beat
(:mod:`belayq.primary`), which wakes the beat at once when the primary moved.

A thread needs the GIL for a few microseconds per tick. Pure-Python CPU-bound work yields
it every ``sys.getswitchinterval()`` (5 ms), so the keeper keeps up; a C extension that
holds the GIL for longer than the lease (one huge regex match, ``sorted()`` of a huge
list, ``sum(range(n))``, big-int arithmetic: measured by ``benchmarks/keeper_gil.py``)
starves every Python thread, and then the lease can expire. Such work should run in a
child process, as RQ's work horse and Celery's prefork pool already do.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any, Protocol

from . import primary

log = logging.getLogger("belayq.keeper")


class KeptQueue(Protocol):
    """What the keeper needs from a queue."""

    client: Any

    def heartbeat(self) -> None: ...

    @property
    def heartbeat_ms(self) -> int: ...


class LeaseKeeper:
    """Runs ``heartbeat()`` of every registered queue at its own period, each on its thread."""

    def __init__(self) -> None:
        self._stops: weakref.WeakKeyDictionary[KeptQueue, threading.Event] = (
            weakref.WeakKeyDictionary()
        )
        self._wakes: weakref.WeakKeyDictionary[KeptQueue, threading.Event] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self.ticks = 0

    def register(self, queue: KeptQueue) -> None:
        """Keep ``queue``'s leases from now on (cheap when it is already kept)."""
        if queue in self._stops:
            return
        with self._lock:
            if queue in self._stops:
                return
            stop, wake = threading.Event(), threading.Event()
            self._stops[queue] = stop
            self._wakes[queue] = wake
            primary.follow(queue.client, queue, queue.heartbeat_ms / 1000, wake.set)
            threading.Thread(
                target=self._run,
                args=(weakref.ref(queue), stop, wake),
                name="belayq-lease-keeper",
                daemon=True,
            ).start()

    def unregister(self, queue: KeptQueue) -> None:
        """Stop keeping ``queue``'s leases."""
        with self._lock:
            stop = self._stops.pop(queue, None)
            wake = self._wakes.pop(queue, None)
        primary.unfollow(queue)
        for event in (stop, wake):
            if event is not None:
                event.set()

    def stop_all(self) -> None:
        """Stop keeping every queue (tests and shutdown hooks; a later claim registers again)."""
        with self._lock:
            queues = list(self._stops.keys())
            events = [*self._stops.values(), *self._wakes.values()]
            self._stops = weakref.WeakKeyDictionary()
            self._wakes = weakref.WeakKeyDictionary()
        for queue in queues:
            primary.unfollow(queue)
        for event in events:
            event.set()

    def _run(
        self, ref: weakref.ref[KeptQueue], stop: threading.Event, wake: threading.Event
    ) -> None:
        started = time.monotonic()
        while True:
            queue = ref()
            if queue is None:
                return
            period = queue.heartbeat_ms / 1000
            del queue
            # From the start of the last beat: a slow beat does not push the next one back
            # by a whole period.
            delay = started + period - time.monotonic()
            if delay > 0:
                wake.wait(delay)
            wake.clear()
            if stop.is_set():
                return
            queue = ref()
            if queue is None:
                return
            started = time.monotonic()
            try:
                queue.heartbeat()
            except Exception as exc:  # a Redis blip must not kill the keeper
                log.warning("lease heartbeat failed; retrying: %s", exc)
            self.ticks += 1
            del queue

    def _after_fork(self) -> None:
        # Threads do not survive a fork; a child that claims starts its own.
        self._stops = weakref.WeakKeyDictionary()
        self._wakes = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()


KEEPER = LeaseKeeper()
os.register_at_fork(after_in_child=KEEPER._after_fork)
