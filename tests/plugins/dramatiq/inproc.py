"""Dramatiq's own Worker in this process on belayq_dramatiq.Broker, and an actor that
records what it ran."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq import Worker

from belayq_dramatiq import Broker


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
