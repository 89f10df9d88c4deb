"""One Dramatiq queue on the core, in one of two layouts:

* :class:`Store`, stock ``RedisBroker``'s (:func:`belayq.keys.dramatiq_layout`): the core
  queue holds the message ids in stock's list, and the hash beside it their bodies, so stock
  producers and consumers can share the queue;
* :class:`ShardedStore`, belayq's own (a ``Broker`` with ``shards``): a
  :class:`~belayq.ShardedQueue` of kind ``dramatiq`` whose payloads are the bodies, over
  ``shards`` hash slots (:func:`belayq.keys.owned_ready_key`), one round trip per publish.

In stock's layout a message id sits in the queue's list as stock producers push it, and its
body in the ``.msgs`` hash beside it, which is the core's payloads hash: the core's publish
writes the body and pushes the id in one script, its claim returns the bodies with the
leases, and its ack deletes the body in the script that accepts the ack (a stale ack,
refused, deletes nothing the redelivered copy needs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from belayq import ConfigError, Delivery, QueueConfig, ReliableQueue, ShardedQueue
from belayq.keys import dramatiq_layout
from belayq.option_names import refuse_unknown

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
    refuse_unknown(set(options) - valid, valid - set(FIXED_OPTIONS),
                   what="belayq_dramatiq belayq_options key")
    fixed = sorted(set(options) & set(FIXED_OPTIONS))
    if fixed:
        raise ConfigError(f"belayq_dramatiq sets {fixed} itself, to fit Dramatiq's lists")
    out = dict(options)
    QueueConfig(**{**out, "claim_starts": False})  # checks every value
    return out


class Store:
    """One Dramatiq queue in stock's layout: its ids in stock's list, claimed by the core,
    and their bodies in ``.msgs``, the core's payloads (see the module doc).

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
        self.name = name
        self._queue = ReliableQueue(client, name, claim_starts=False, record=record, **layout,
                                    **options)
        self.core: ReliableQueue | ShardedQueue = self._queue

    def publish(self, message_id: str, body: bytes, *, delay_ms: int = 0,
                dedup_id: str | None = None) -> None:
        """Store a body under its id and publish the id (ready, or delayed ``delay_ms`` in
        Redis), in one round trip. An id already in the queue stores nothing."""
        self._queue.publish_result(body, delay_ms=delay_ms, dedup_id=dedup_id,
                                   message_id=message_id)

    def ack(self, delivery: Delivery) -> bool:
        """Ack a claim, and delete its body with it (False: refused, its lease had expired
        and it was claimed again; the body stays for the copy that holds it)."""
        return self.core.ack(delivery)

    def purge(self) -> int:
        """Delete the waiting (ready and delayed) messages and the dead letters, with their
        bodies. Claimed messages stay. Returns how many were deleted."""
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


class ShardedStore(Store):
    """One Dramatiq queue in belayq's own layout: a :class:`~belayq.ShardedQueue` of kind
    ``dramatiq`` over ``shards`` slots, whose payloads are the message bodies (no stock
    producer or consumer reads these keys). Same calls as :class:`Store`.

    Args:
        client: A ``redis.Redis`` or ``RedisCluster`` (``decode_responses=False``).
        name: The Dramatiq queue name.
        shards: How many shards (1 is belayq's layout unsharded).
        options: :class:`~belayq.QueueConfig` fields, checked by :func:`core_options`.
    """

    def __init__(self, client: Any, name: str, *, shards: int, options: Mapping[str, Any]
                 ) -> None:
        self.name = name
        self.core = ShardedQueue(client, name, shards=shards, kind="dramatiq",
                                 claim_starts=False, **options)

    def publish(self, message_id: str, body: bytes, *, delay_ms: int = 0,
                dedup_id: str | None = None) -> None:
        """Publish a body (ready, or delayed ``delay_ms`` in Redis) under a new core id;
        ``message_id`` is in the body already."""
        self.core.publish(body, delay_ms=delay_ms, dedup_id=dedup_id)


