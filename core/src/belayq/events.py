"""Listening to a queue's events (``events=True``): completed, failed, reclaimed and
dead-lettered messages, as the scripts publish them on the queue's channel.

On Redis 7.0+ the events are sharded pub/sub (``SPUBLISH``/``SSUBSCRIBE``): a cluster routes
them to the node that serves the queue's slot, so they work on a cluster too; on 6.2 they
are plain pub/sub. Pub/sub is at-most-once: a listener that is not connected when an event
goes out does not get it (the counters and the history are the record).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import redis_errors as _redis_errors

if TYPE_CHECKING:
    from .queue import ReliableQueue

#: The events a queue publishes.
KINDS = ("completed", "failed", "reclaimed", "dead_lettered")


@dataclass(frozen=True)
class Event:
    """One event.

    Attributes:
        kind: ``completed``, ``failed`` (a run failed; the message waits again),
            ``reclaimed`` (its lease expired; back to ready) or ``dead_lettered``.
        id: The message id.
        queue: The queue's name.
        deliveries: How many times it had been claimed.
        attempts: How many of those runs started.
        ms: When (ms, server clock).
        reason: The reason of a failure, a reclaim or a dead letter (``""`` otherwise).
    """

    kind: str
    id: str
    queue: str
    deliveries: int
    attempts: int
    ms: int
    reason: str = ""


def _event(queue: str, data: bytes) -> Event:
    body = json.loads(data)
    return Event(
        kind=str(body["event"]), id=str(body["id"]), queue=queue,
        deliveries=int(body["deliveries"]), attempts=int(body["attempts"]),
        ms=int(body["ms"]), reason=str(body.get("reason", "")),
    )  # fmt: skip


class EventStream:
    """A subscription to one queue's events; use it as an iterator, or call :meth:`get`.

    Args:
        queue: The queue (its client, channel, and whether the server shards pub/sub).
    """

    def __init__(self, queue: ReliableQueue) -> None:
        self.queue = queue
        self.channel = queue.keys.events
        self.sharded = queue._scripts.sharded_events
        self._pubsub: Any = queue.client.pubsub()
        self._subscribe()

    @_redis_errors
    def _subscribe(self) -> None:
        if self.sharded:
            self._pubsub.ssubscribe(self.channel)
        else:
            self._pubsub.subscribe(self.channel)

    @_redis_errors
    def get(self, timeout: float = 1.0) -> Event | None:
        """The next event, or None when none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            if self.sharded:
                message = self._pubsub.get_sharded_message(
                    ignore_subscribe_messages=True, timeout=left
                )
            else:
                message = self._pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            if message and message.get("type") in ("message", "smessage"):
                return _event(self.queue.name, message["data"])
            if left <= 0:
                return None

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self.get(timeout=1.0)
            if event is not None:
                yield event

    def close(self) -> None:
        self._pubsub.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
