"""Where a :class:`~belayq.ShardedQueue` of a kind keeps its keys, and the record of its
layout: the shard count in the plain queue's stats hash and the registry's record, both
checked before anything is written (mixed into it). On a full server (``maxmemory`` under
``noeviction``) both writes are best-effort, with a warning, so that a queue can always be
opened to drain it."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from .errors import NO_PERMISSION, OUT_OF_MEMORY, ConfigError
from .errors import redis_errors as _redis_errors
from .keys import SHARDS_FIELD, QueueKeys, owned_ready_key
from .queue import ReliableQueue
from .registry import QueueRecord, Registry, check_layout, record_or_warn
from .sharded_admin import ShardedAdmin

log = logging.getLogger("belayq")


class ShardedLayout(ShardedAdmin):
    """The layout of :class:`~belayq.ShardedQueue`: its keys and their records."""

    _prefix: str

    def _owned(self, name: str) -> dict[str, Any]:
        """The ReliableQueue arguments that place queue ``name`` where this kind's queues
        owned by belayq sit (none for kind ``belayq``)."""
        ready = owned_ready_key(self.kind, name, self._prefix)
        return {} if ready is None else {"ready_key": ready}

    def _replaces(self, old: QueueRecord, mine: QueueRecord) -> bool:
        """Whether ``mine`` may replace record ``old``: the plain queue of this name and
        kind, sharded now, or the other way round (the shard count recorded in its stats
        hash decides, see :meth:`_record_count`). A record of another layout (a
        framework's own lists) may not."""
        plain = self._owned(self.name).get("ready_key")
        layouts = (old.ready_key, mine.ready_key)
        return old.shards != mine.shards and all(k in (plain, None) for k in layouts)

    def _check_recorded_layout(self, mine: QueueRecord) -> None:
        """Refuse (``ConfigError``) to open a queue recorded with another layout, before
        anything is written."""
        with contextlib.suppress(*NO_PERMISSION):  # an unreadable registry: warned later
            old = Registry(self.client, self.config.prefix).get(self.kind, self.name)
            if old is not None and not self._replaces(old, mine):
                check_layout(old, mine)

    def _record_in_registry(self, mine: QueueRecord) -> QueueRecord:
        """Record the logical queue; a drained plain queue sharded now is recorded anew
        (see :meth:`_replaces`)."""
        registry = Registry(self.client, self.config.prefix)
        with contextlib.suppress(*NO_PERMISSION):  # warned below
            old = registry.get(self.kind, self.name)
            if old is not None and self._replaces(old, mine):
                registry.forget(self.kind, self.name)
        return record_or_warn(registry, mine)

    def count_key(self) -> str:
        """The hash that records the shard count: the stats hash of the plain queue of
        this name and kind (``belayq:{<name>}:stats``)."""
        return QueueKeys.build(self.name, prefix=self.config.prefix,
                               **self._owned(self.name)).stats

    @_redis_errors
    def _record_count(self, shards: int) -> None:
        owned = self._owned(self.name)
        base = self.count_key()
        schema, recorded = self.client.hmget(base, ["schema", SHARDS_FIELD])
        if recorded is None:
            if schema is not None:
                plain = ReliableQueue(
                    self.client, self.name, keeper=False, prefix=self.config.prefix,
                    kind=self.kind, record=False, **owned,
                )
                s = plain.stats()
                held = sum(s[k] for k in ("ready", "in_flight", "landing", "delayed", "dead"))
                if held:
                    raise ConfigError(
                        f"queue {self.name!r} holds {held} message(s) as an unsharded queue; "
                        "drain it (consumers with shards=1, or none) before sharding it"
                    )
            try:
                self.client.hsetnx(base, SHARDS_FIELD, shards)
            except OUT_OF_MEMORY as exc:  # drained all the same; recorded at a later open
                _count_unwritten(self.name, base, shards, exc)
                return
            recorded = self.client.hget(base, SHARDS_FIELD)
        if int(recorded) != shards:
            raise ConfigError(
                f"queue {self.name!r} is sharded over {int(recorded)} shards (recorded in "
                f"{base!r}), not {shards}: open it with shards={int(recorded)}. To change the "
                "count, stop its producers, let its consumers drain it, drop it (`belayq "
                "drop`), then open it with the new count"
            )


def _count_unwritten(name: str, key: str, shards: int, exc: BaseException) -> None:
    """Warn (once per queue and process) that a full server refused to record the shard
    count: the queue opens over its ``shards`` shards, so that it can be drained."""
    if key in _FULL:
        return
    _FULL.add(key)
    log.warning(
        "queue %r: the Redis server is full (%s), so its shard count (%d) was not recorded "
        "in %r; the queue opens over %d shards, and the count is recorded by the next "
        "process that opens it once there is memory again.", name, exc, shards, key, shards)


#: The shard counts a full server refused in this process, by key: warned once.
_FULL: set[str] = set()


def recorded_shards(client: Any, name: str, prefix: str = "belayq") -> int:
    """The shard count recorded for queue ``name`` (1 when none is: a plain queue, or none)."""
    recorded = client.hget(QueueKeys.build(name, prefix=prefix).stats, SHARDS_FIELD)
    return 1 if recorded is None else int(recorded)
