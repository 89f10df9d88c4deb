"""Dramatiq's own Worker in this process on belayq_dramatiq.Broker, and an actor that
records what it ran."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq import Worker

from belayq_dramatiq import Broker
from tests.support import wait_for


class Ran:
    """An actor that records the keys it ran, in this process."""

    def __init__(self, broker: Broker) -> None:
        self.keys: list[str] = []
        self.lock = threading.Lock()

        @dramatiq.actor(broker=broker, max_retries=0, actor_name="note")
        def note(key: str) -> None:
            with self.lock:
                self.keys.append(key)

        self.actor = note

    def seen(self) -> set[str]:
        with self.lock:
            return set(self.keys)


def run_with_worker(broker: Broker, body: Callable[[Ran], Any]) -> None:
    ran = Ran(broker)
    worker = Worker(broker, worker_timeout=100, worker_threads=4)
    worker.start()
    try:
        body(ran)
    finally:
        worker.stop()
        broker.close()


def sends_and_drains(broker: Broker, n: int) -> Callable[[Ran], None]:
    """A body for :func:`run_with_worker`: ``n`` messages and one delayed 300 ms, waited
    for until each ran and the queue is settled."""

    def body(ran: Ran) -> None:
        for i in range(n):
            ran.actor.send(f"k{i}")
        ran.actor.send_with_options(args=("late",), delay=300)
        expected = {*(f"k{i}" for i in range(n)), "late"}
        wait_for(lambda: ran.seen() == expected, 30, ran.seen)
        broker.join("default", timeout=10_000)

    return body
