"""One Dramatiq queue on the core, in one of two layouts:

* :class:`Store`, stock ``RedisBroker``'s (:func:`belayq.keys.dramatiq_layout`): the core
  queue holds the message ids in stock's list, and the hash beside it their bodies, so stock
  producers and consumers can share the queue;
* :class:`ShardedStore`, belayq's own (a ``Broker`` with ``shards``): a
  :class:`~belayq.ShardedQueue` of kind ``dramatiq`` whose payloads are the bodies, over
  ``shards`` hash slots (:func:`belayq.keys.owned_ready_key`), one round trip per publish.

In stock's layout:

A message id sits in the queue's list as stock producers push it, and its body in the
``.msgs`` hash beside it; the core claims the id with a lease and settles it with a fencing
token. The body is written before the id is published (a crash in between leaves a body no
id points to, never an id without its body) and deleted only after the core accepted the
ack (a stale ack, refused, deletes nothing the redelivered copy needs). redis-py's errors
come out as the core's (``ConnectionLost``...), as the core's own calls raise them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from belayq import ConfigError, Delivery, QueueConfig, ReliableQueue, ShardedQueue
from belayq.errors import redis_errors
from belayq.keys import dramatiq_layout

#: QueueConfig fields belayq_dramatiq sets itself: stock RedisBroker's list layout, and runs
#: counted when Dramatiq starts them (its workers prefetch).
FIXED_OPTIONS = ("priority_steps", "payload_in_list", "ready_head", "claim_starts")


def core_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked as :class:`~belayq.QueueConfig` fields the adapter lets a user set.

    Raises:
        ConfigError: An unknown field, one the adapter sets itself, or a bad value.
    """
    if not isinstance(options, Mapping):
        raise ConfigError(f"belayq options must be a mapping, got {options!r}")
    valid = {f.name for f in dataclasses.fields(QueueConfig)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ConfigError(
            f"unknown belayq option(s) {unknown}; valid: {sorted(valid - set(FIXED_OPTIONS))}"
        )
    fixed = sorted(set(options) & set(FIXED_OPTIONS))
    if fixed:
        raise ConfigError(f"belayq_dramatiq sets {fixed} itself, to fit Dramatiq's lists")
    out = dict(options)
    QueueConfig(**{**out, "claim_starts": False})  # checks every value
    return out


#: Bodies of acked messages deleted together (one ``HDEL`` instead of one per message).
ACKED_BATCH = 64


class Store:
    """The ids (in the core) and bodies (in ``.msgs``) of one Dramatiq queue.

    Args:
        client: A ``redis.Redis`` or ``RedisCluster`` (``decode_responses=False``).
        name: The Dramatiq queue name (``default``, ``default.DQ`` ...).
        namespace: Stock RedisBroker's ``namespace``.
        cluster: Lay the keys out in one hash tag (see :func:`dramatiq_layout`).
        options: :class:`~belayq.QueueConfig` fields, checked by :func:`core_options`.
        record: Record the queue in belayq's registry.
    """

    def __init__(
        self, client: Any, name: str, *, namespace: str, cluster: bool,
        options: Mapping[str, Any], record: bool = True,
    ) -> None:
        layout: dict[str, Any] = dramatiq_layout(name, namespace=namespace, cluster=cluster)
        self.messages = str(layout.pop("messages"))
        self.client = client
        self.name = name
        self.core = ReliableQueue(client, name, claim_starts=False, record=record, **layout,
                                  **options)
        self._acked: list[bytes] = []
        self._lock = threading.Lock()

    @redis_errors
    def publish(self, message_id: str, body: bytes, *, delay_ms: int = 0,
                dedup_id: str | None = None) -> None:
        """Store a body, then publish its id (ready, or delayed ``delay_ms`` in Redis), in
        one round trip (on a cluster, or when writes wait for replicas, in two)."""
        self.core.publish_result(message_id, delay_ms=delay_ms, dedup_id=dedup_id,
                                 before=("HSET", self.messages, message_id, body))

    @redis_errors
    def bodies(self, deliveries: Sequence[Delivery]) -> list[bytes | None]:
        """The body of each claimed message (None when its body is missing)."""
        if not deliveries:
            return []
        return list(self.client.hmget(self.messages, [d.payload for d in deliveries]))

    def ack(self, delivery: Delivery) -> bool:
        """Ack a claim; its body goes only when the core accepted the ack, with others
        (see :meth:`delete_acked`)."""
        if not self.core.ack(delivery):
            return False
        with self._lock:
            self._acked.append(delivery.payload)
            due = len(self._acked) >= ACKED_BATCH
        if due:
            self.delete_acked()
        return True

    @redis_errors
    def delete_acked(self) -> None:
        """Delete the bodies of the messages acked since the last call, in one ``HDEL``:
        called once :data:`ACKED_BATCH` wait, when the consumer finds the queue empty, and
        when the broker closes. A body not deleted (Redis unreachable) is tried again the
        next time; one left by a killed worker stays (see the docs' limits)."""
        with self._lock:
            acked, self._acked = self._acked, []
        if not acked:
            return
        try:
            self.client.hdel(self.messages, *acked)
        except Exception:
            with self._lock:
                self._acked[:0] = acked
            raise

    @redis_errors
    def purge(self) -> int:
        """Delete the waiting (ready and delayed) messages and the dead letters, with their
        bodies. Claimed messages stay. Returns how many were deleted."""

        def drop(entries: list[bytes]) -> None:
            if entries:
                self.client.hdel(self.messages, *entries)

        total = int(self.core.purge(delayed=True, on_entries=drop))
        while True:
            dead = self.core.dead_letters(limit=1000)
            if not dead:
                return total
            drop([d.payload for d in dead if d.payload is not None])
            total += self.core.delete_dead([d.id for d in dead])

    def size(self) -> int:
        """Messages not yet settled: ready, delayed, claimed, landing."""
        s = self.core.stats()
        return s["ready"] + s["delayed"] + s["in_flight"] + s["landing"]


class ShardedStore:
    """One Dramatiq queue in belayq's own layout: a :class:`~belayq.ShardedQueue` of kind
    ``dramatiq`` over ``shards`` slots, whose payloads are the message bodies (one round trip
    per publish; no stock producer or consumer reads these keys). Same calls as
    :class:`Store`.

    Args:
        client: A ``redis.Redis`` or ``RedisCluster`` (``decode_responses=False``).
        name: The Dramatiq queue name.
        shards: How many shards (1 is belayq's layout unsharded).
        options: :class:`~belayq.QueueConfig` fields, checked by :func:`core_options`.
    """

    def __init__(self, client: Any, name: str, *, shards: int, options: Mapping[str, Any]
                 ) -> None:
        self.client = client
        self.name = name
        self.core = ShardedQueue(client, name, shards=shards, kind="dramatiq",
                                 claim_starts=False, **options)

    def publish(self, message_id: str, body: bytes, *, delay_ms: int = 0,
                dedup_id: str | None = None) -> None:
        """Publish a body (ready, or delayed ``delay_ms`` in Redis); ``message_id`` is in
        the body already."""
        self.core.publish(body, delay_ms=delay_ms, dedup_id=dedup_id)

    def bodies(self, deliveries: Sequence[Delivery]) -> list[bytes | None]:
        """The body of each claimed message: its payload."""
        return [d.payload for d in deliveries]

    def ack(self, delivery: Delivery) -> bool:
        """Ack a claim (False: refused, its lease had expired and it was claimed again)."""
        return self.core.ack(delivery)

    def delete_acked(self) -> None:
        """Nothing to delete: a body goes with its message."""

    def purge(self) -> int:
        """Delete the waiting (ready and delayed) messages and the dead letters. Claimed
        messages stay. Returns how many were deleted."""
        total = int(self.core.purge(delayed=True))
        while True:
            dead = self.core.dead_letters(limit=1000)
            if not dead:
                return total
            total += self.core.delete_dead([d.id for d in dead])

    def size(self) -> int:
        """Messages not yet settled: ready, delayed, claimed, landing."""
        s = self.core.stats()
        return s["ready"] + s["delayed"] + s["in_flight"] + s["landing"]


#: Either layout's store.
AnyStore = Store | ShardedStore
