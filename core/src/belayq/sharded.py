"""A hot queue spread over several cluster slots: :class:`ShardedQueue`.

One belayq queue lives on one hash slot, so on one Redis Cluster node, whatever its load.
A :class:`ShardedQueue` is one logical queue made of ``shards`` ordinary belayq queues (its
*shards*), each with its own hash tag (:func:`belayq.keys.shard_names`), so ``shards`` slots,
spread over the nodes. Every script still touches one slot: the logical queue is composed
here, in Python.

* Publishing spreads messages round robin (from a random start per process); a message with
  a ``dedup_id`` goes to the shard the id hashes to (CRC32), so deduplication still holds.
* Claiming is :func:`belayq.claim_any` over the shards, starting at a random shard: one
  script when the first shard tried has work; when all are empty it blocks in BLMOVE on every
  shard at once (on a cluster, on each shard's node), so an idle consumer does not poll.
* Settling goes to the shard that owns the claim (:attr:`Delivery.shard`); fencing, leases,
  sweeps, delayed messages and dead letters stay per shard, exactly as in one queue.
* Inspection (stats, dead letters, history, replay, purge, drop) sees the logical queue:
  sums and merges over the shards, with per-shard figures from :meth:`shard_stats`.

Priorities and FIFO hold within a shard. Across shards there is no global order: two
messages published one after the other may run in either order, and a consumer may take a
priority-5 message from one shard while another shard holds a priority-0 one.

The shard count is recorded in the logical queue's own stats hash (``belayq:{q}:stats``,
field ``shards``) when it is above 1; opening the queue with another count, or as a plain
queue, is refused (:class:`~belayq.ConfigError`), so no message is stranded in shards
nobody reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from .claim_any import claim_any
from .errors import ConfigError
from .errors import redis_errors as _redis_errors
from .keys import shard_names
from .models import Delivery, Published, SweepResult
from .queue import ReliableQueue
from .registry import check_kind
from .sharded_layout import ShardedLayout

T = TypeVar("T")


class ShardedQueue(ShardedLayout):
    """One logical queue over ``shards`` belayq queues on distinct cluster slots.

    It offers :class:`ReliableQueue`'s producing, consuming, settling and inspection calls;
    each delivery names its shard (:attr:`Delivery.shard`), and settles go there.

    Args:
        client: As for :class:`ReliableQueue` (a ``RedisCluster`` spreads the shards over
            its nodes; on one server the shards are just several queues).
        name: The logical queue's name.
        shards: How many shards, 1..``MAX_SHARDS`` (64). ``shards=1`` is the plain queue
            ``name`` itself, byte for byte.
        keeper: Whether claims register with the lease keeper (one thread per shard).
        record: Record the logical queue in the registry (see :class:`ReliableQueue`).
        kind: Who the queue belongs to (``belayq``; an adapter names its own kind, whose
            keys then sit apart from belayq's queue of the same name: see
            :func:`belayq.keys.owned_ready_key`).
        **options: :class:`~belayq.config.QueueConfig` fields, the same for every shard.

    Raises:
        ConfigError: A bad shard count or option; the queue was recorded with another shard
            count; or it still holds messages as an unsharded queue.
        Others: As :class:`ReliableQueue`.
    """

    #: As :attr:`ReliableQueue.limits_known`.
    limits_known: bool = True

    def __init__(
        self, client: Any, name: str, *, shards: int, keeper: bool = True, record: bool = True,
        kind: str = "belayq", **options: Any,
    ) -> None:
        names = shard_names(name, shards)
        if "ready_key" in options or "level_keys" in options:
            raise ConfigError("a ShardedQueue owns its keys: ready_key/level_keys do not apply")
        self.name = name
        self.client = client
        self.kind = check_kind(kind)
        self._prefix = str(options.get("prefix", "belayq"))
        parts = [ReliableQueue(client, n, keeper=keeper, record=False, kind=kind,
                               **self._owned(n), **options) for n in names]
        self.config = parts[0].config
        mine = None
        if record:
            mine = dataclasses.replace(parts[0].record(shards), name=name)
            if shards > 1:  # the shards' keys follow from the kind and the name
                mine = dataclasses.replace(mine, ready_key=None, level_keys=())
            _redis_errors(self._check_recorded_layout)(mine)  # before anything is written
        if shards > 1:
            self._record_count(shards)
        if mine is not None:
            stood = _redis_errors(self._record_in_registry)(mine)
            for i, q in enumerate(parts):
                q.sharded_as = name
                q._adopt(stood, warn=i == 0)  # one queue: one warning, by its name
            self.config = parts[0].config
        for q in parts:
            q.sharded_as = name
        self.shards: tuple[ReliableQueue, ...] = tuple(parts)
        self._by_name = {q.name: q for q in parts}
        # Publishes take turns from a random start (a process that publishes and claims
        # alternately still deals its messages over every shard). Claims start at a random
        # shard each time: a counter copied into forked consumers (Celery's prefork pool)
        # would have them all try the same shard at the same moment.
        self._publish_turn = itertools.count(random.randrange(shards))

    # -- routing ------------------------------------------------------------------------

    def _rotation(self) -> list[ReliableQueue]:
        start = random.randrange(len(self.shards))
        return [*self.shards[start:], *self.shards[:start]]

    def shard_of(self, delivery: Delivery) -> ReliableQueue:
        """The shard that owns a claim.

        Raises:
            ConfigError: The claim was not made through this queue.
        """
        q = self._by_name.get(delivery.shard or delivery.queue)
        if q is None:
            raise ConfigError(
                f"delivery {delivery.id!r} was not claimed from queue {self.name!r} (its "
                f"shard {delivery.shard!r} is none of {sorted(self._by_name)})"
            )
        return q

    def _grouped(self, items: Sequence[T], key: Any) -> dict[ReliableQueue, list[int]]:
        """Positions of ``items`` by the shard ``key(item)`` (a delivery) belongs to."""
        groups: dict[ReliableQueue, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(self.shard_of(key(item)), []).append(i)
        return groups

    def _scatter(self, deliveries: Sequence[Delivery], call: Any) -> list[Any]:
        """``call(shard, its deliveries)`` per shard; one answer per delivery, in order."""
        out: list[Any] = [None] * len(deliveries)
        for q, idx in self._grouped(deliveries, lambda d: d).items():
            for i, answer in zip(idx, call(q, [deliveries[i] for i in idx]), strict=True):
                out[i] = answer
        return out

    # -- producing ----------------------------------------------------------------------

    def _pick(self, dedup_id: str | None) -> ReliableQueue:
        if dedup_id:
            digest = hashlib.sha1(dedup_id.encode("utf-8")).digest()
            return self.shards[int.from_bytes(digest[:4], "big") % len(self.shards)]
        return self.shards[next(self._publish_turn) % len(self.shards)]

    def publish_result(
        self,
        payload: bytes | str,
        *,
        priority: int = 0,
        delay_ms: int = 0,
        dedup_id: str | None = None,
    ) -> Published:
        """As :meth:`ReliableQueue.publish_result`, on the next shard (round robin), or on
        the shard ``dedup_id`` hashes to."""
        return self._pick(dedup_id).publish_result(
            payload, priority=priority, delay_ms=delay_ms, dedup_id=dedup_id
        )

    def publish(
        self,
        payload: bytes | str,
        *,
        priority: int = 0,
        delay_ms: int = 0,
        dedup_id: str | None = None,
    ) -> str:
        """As :meth:`ReliableQueue.publish`, on the next shard (round robin), or on the
        shard ``dedup_id`` hashes to."""
        return self.publish_result(
            payload, priority=priority, delay_ms=delay_ms, dedup_id=dedup_id
        ).id

    def publish_many(
        self, payloads: Iterable[bytes | str], *, priority: int = 0, batch: int = 100
    ) -> list[str]:
        """Publish many messages dealt round robin over the shards (one script per shard
        and ``batch``); returns their ids in order."""
        items = list(payloads)
        n = len(self.shards)
        start = next(self._publish_turn)
        ids: list[str] = [""] * len(items)
        for k in range(n):
            q = self.shards[(start + k) % n]
            idx = list(range(k, len(items), n))
            if idx:
                got = q.publish_many([items[i] for i in idx], priority=priority, batch=batch)
                for i, msg_id in zip(idx, got, strict=True):
                    ids[i] = msg_id
        return ids

    # -- consuming ----------------------------------------------------------------------

    def claim(self, timeout: float | None = 1.0, count: int = 1) -> list[Delivery]:
        """Claim up to ``count`` messages from the shards, starting at a random one,
        waiting up to ``timeout`` s for the first (blocked on every shard at once: see
        :func:`belayq.claim_any`). ``timeout=0`` does not wait; None waits until one comes.
        On a cluster, a shard whose node is away (failing over) is skipped and looked at
        again now and then, while the other shards are claimed from as usual.
        """
        for q in self.shards:  # every shard is swept by every consumer's keeper, not only
            q._keep()  # those its claims happened to try (cheap once kept)
        return claim_any(self._rotation(), timeout, count)

    def ack_and_claim(
        self, deliveries: Sequence[Delivery], count: int
    ) -> tuple[list[bool], list[Delivery]]:
        """Ack claims and claim up to ``count`` more: one round trip when the claims are of
        one shard and it has work waiting (its :meth:`ReliableQueue.ack_and_claim`); else
        the acks, then a claim over every shard without waiting.

        Returns:
            One bool per acked claim, and the new deliveries (``[]`` if none waits).
        """
        groups = self._grouped(deliveries, lambda d: d)
        if len(groups) != 1:
            return self.ack_many(deliveries), self.claim(0, count)
        [q] = groups
        acked, got = q.ack_and_claim(deliveries, count)
        return acked, got or self.claim(0, count)

    # -- settling -----------------------------------------------------------------------

    def ack(self, delivery: Delivery, result: bytes | str | None = None) -> bool:
        """As :meth:`ReliableQueue.ack`, on the claim's shard."""
        return self.shard_of(delivery).ack(delivery, result)

    def ack_many(
        self,
        deliveries: Sequence[Delivery],
        results: Sequence[bytes | str | None] | None = None,
    ) -> list[bool]:
        """As :meth:`ReliableQueue.ack_many`: one script per shard involved."""
        if results is None:
            return self._scatter(deliveries, lambda q, ds: q.ack_many(ds))
        if len(results) != len(deliveries):
            raise ConfigError(f"ack_many got {len(results)} results for {len(deliveries)} claims")
        by_id = {id(d): r for d, r in zip(deliveries, results, strict=True)}
        return self._scatter(deliveries, lambda q, ds: q.ack_many(ds, [by_id[id(d)] for d in ds]))

    def nack(self, delivery: Delivery, *, delay_ms: int | None = 0, reason: str = "") -> str:
        """As :meth:`ReliableQueue.nack`, on the claim's shard (a delayed retry waits in
        that shard)."""
        return self.shard_of(delivery).nack(delivery, delay_ms=delay_ms, reason=reason)

    def dead_letter(self, delivery: Delivery, reason: str, *, runs_before: int = 0,
                    payload: bytes | None = None) -> bool:
        """As :meth:`ReliableQueue.dead_letter`, on the claim's shard."""
        return self.shard_of(delivery).dead_letter(delivery, reason, runs_before=runs_before,
                                                   payload=payload)

    def extend(self, deliveries: Sequence[Delivery]) -> list[bool]:
        """As :meth:`ReliableQueue.extend`: one script per shard involved."""
        return self._scatter(deliveries, lambda q, ds: q.extend(ds))

    def release(self, deliveries: Sequence[Delivery]) -> int:
        """As :meth:`ReliableQueue.release`; returns how many went back."""
        return sum(
            q.release([deliveries[i] for i in idx])
            for q, idx in self._grouped(deliveries, lambda d: d).items()
        )

    def defer(self, deferrals: Sequence[tuple[Delivery, int]]) -> int:
        """As :meth:`ReliableQueue.defer`; each waits in its own shard's delayed set."""
        return sum(
            q.defer([deferrals[i] for i in idx])
            for q, idx in self._grouped(deferrals, lambda p: p[0]).items()
        )

    def start(self, deliveries: Sequence[Delivery], *, now: bool = False) -> None:
        """As :meth:`ReliableQueue.start`."""
        for q, idx in self._grouped(deliveries, lambda d: d).items():
            q.start([deliveries[i] for i in idx], now=now)

    def forget(self, deliveries: Iterable[Delivery]) -> None:
        """As :meth:`ReliableQueue.forget`."""
        items = list(deliveries)
        for q, idx in self._grouped(items, lambda d: d).items():
            q.forget([items[i] for i in idx])

    def retry_later(self, op: str, deliveries: Sequence[Delivery], reason: str = "") -> None:
        """As :meth:`ReliableQueue.retry_later`, by each claim's shard."""
        for q, idx in self._grouped(deliveries, lambda d: d).items():
            q.retry_later(op, [deliveries[i] for i in idx], reason)

    def is_last_run(self, delivery: Delivery) -> bool:
        """As :meth:`ReliableQueue.is_last_run`."""
        return self.shard_of(delivery).is_last_run(delivery)

    @property
    def held(self) -> list[Delivery]:
        """The claims this object holds and has not settled, over every shard."""
        return [d for q in self.shards for d in q.held]

    # -- upkeep -------------------------------------------------------------------------

    def sweep(self) -> SweepResult:
        """Run every shard's recovery pass now; the counts are summed."""
        results = [q.sweep() for q in self.shards]
        return SweepResult(
            True,
            *(
                sum(getattr(r, f.name) for r in results)
                for f in dataclasses.fields(SweepResult)[1:]
            ),
        )

    def events(self) -> Any:
        """Not offered: each shard publishes its events on its own channel.

        Raises:
            ConfigError: Always; subscribe to the shards instead
                (``[s.events() for s in q.shards]``).
        """
        raise ConfigError(
            f"queue {self.name!r} is sharded: its events go to each shard's channel; "
            "subscribe to them with [s.events() for s in q.shards]"
        )

    def close(self, *, release: bool = True) -> None:
        """As :meth:`ReliableQueue.close`, for every shard."""
        for q in self.shards:
            q.close(release=release)

    def __repr__(self) -> str:
        return f"<ShardedQueue {self.name!r} shards={len(self.shards)}>"


AnyQueue = ReliableQueue | ShardedQueue
"""A plain queue or a sharded one (what the command line, dashboard and metrics take)."""


def parts_of(q: AnyQueue) -> tuple[ReliableQueue, ...]:
    """The plain queues a queue is made of: its shards, or itself."""
    return q.shards if isinstance(q, ShardedQueue) else (q,)
