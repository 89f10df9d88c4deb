"""Inspection and administration of a :class:`~belayq.ShardedQueue` as one logical queue:
sums and merges over its shards (mixed into it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .admin import Purged
from .config import QueueConfig
from .errors import ConfigError
from .errors import redis_errors as _redis_errors
from .keys import SHARDS_FIELD
from .models import DeadLetter, HistoryRecord, Lease
from .queue import ReliableQueue
from .registry import Registry

#: Stats that are neither sizes nor counters (not summed over the shards).
_NOT_SUMMED = ("schema", "paused", "paused_since_ms")


class ShardedAdmin:
    """Read-mostly operations of :class:`~belayq.ShardedQueue` (mixed into it)."""

    name: str
    kind: str
    client: Any
    config: QueueConfig
    shards: tuple[ReliableQueue, ...]
    _by_name: dict[str, ReliableQueue]

    def count_key(self) -> str:
        """The hash that records the shard count (the logical queue's stats hash)."""
        raise NotImplementedError

    def shard_stats(self) -> dict[str, dict[str, int]]:
        """Each shard's :meth:`ReliableQueue.stats`, by shard name."""
        return {q.name: q.stats() for q in self.shards}

    def stats(self) -> dict[str, int]:
        """The logical queue's sizes and counters: each summed over the shards (see
        :meth:`ReliableQueue.stats`), ``shards``, the shard count, and ``paused``: 1 when
        any shard is paused (``paused_since_ms``: the earliest)."""
        out: dict[str, int] = {}
        every = self.shard_stats().values()
        for s in every:
            for name, value in s.items():
                if name not in _NOT_SUMMED:
                    out[name] = out.get(name, 0) + value
        out["shards"] = len(self.shards)
        paused = [s.get("paused_since_ms") for s in every]
        out["paused"] = int(any(p is not None for p in paused))
        since = [p for p in paused if p is not None]
        if since:
            out["paused_since_ms"] = min(since)
        return out

    def pause(self, by: str | None = None) -> bool:
        """Pause the claims of every shard (see :meth:`ReliableQueue.pause`); True when
        any shard was not paused yet."""
        return any([q.pause(by) for q in self.shards])

    def resume(self, by: str | None = None) -> bool:
        """Resume the claims of every shard (see :meth:`ReliableQueue.resume`); True when
        any shard was paused."""
        return any([q.resume(by) for q in self.shards])

    def in_flight(self, limit: int = 100) -> list[Lease]:
        """The claims held in every shard, the soonest to expire first (see
        :meth:`ReliableQueue.in_flight`)."""
        every = [lease for q in self.shards for lease in q.in_flight(limit)]
        return sorted(every, key=lambda lease: lease.deadline_ms)[:limit]

    def holders(self, limit: int = 10_000) -> dict[str, int]:
        """How many leases each consumer holds over every shard (see
        :meth:`ReliableQueue.holders`)."""
        out: dict[str, int] = {}
        for q in self.shards:
            for holder, n in q.holders(limit).items():
                out[holder] = out.get(holder, 0) + n
        return out

    def ready_by_level(self) -> list[int]:
        """Messages waiting in each priority level, summed over the shards."""
        per = [q.ready_by_level() for q in self.shards]
        return [sum(level) for level in zip(*per, strict=True)]

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest ``limit`` dead letters of every shard together, newest first."""
        every = [d for q in self.shards for d in q.dead_letters(limit)]
        return sorted(every, key=lambda d: -d.dead_at_ms)[:limit]

    def history(self, outcome: str = "done", limit: int = 50) -> list[HistoryRecord]:
        """The newest ``limit`` finished messages of every shard together, newest first."""
        every = [h for q in self.shards for h in q.history(outcome, limit)]
        return sorted(every, key=lambda h: -h.finished_ms)[:limit]

    @_redis_errors
    def replay_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """As :meth:`ReliableQueue.replay_dead`: the dead letters in ``ids`` (each back in
        its own shard), or, when ``ids`` is None, the oldest ``limit`` over every shard."""
        return self._dead_letters("replay_dead", ids, limit)

    @_redis_errors
    def delete_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """As :meth:`ReliableQueue.delete_dead`, over every shard."""
        return self._dead_letters("delete_dead", ids, limit)

    def _dead_letters(self, call: str, ids: Sequence[str] | None, limit: int) -> int:
        if isinstance(ids, (str, bytes)):
            raise ConfigError(f"{call}(ids=...) takes a sequence of ids, not one string")
        if ids is not None:
            wanted = list(ids)
            return sum(getattr(q, call)(wanted) for q in self.shards) if wanted else 0
        oldest = sorted(
            (float(at), q.name, m.decode())
            for q in self.shards
            for m, at in q.client.zrange(q.keys.dead, 0, limit - 1, withscores=True)
        )
        by_shard: dict[str, list[str]] = {}
        for _, shard, msg_id in oldest[:limit]:
            by_shard.setdefault(shard, []).append(msg_id)
        return sum(getattr(self._by_name[s], call)(chunk) for s, chunk in by_shard.items())

    def purge(
        self, on_batch: Callable[[int], Any] | None = None, *, delayed: bool = True,
        on_entries: Callable[[list[bytes]], Any] | None = None,
    ) -> Purged:
        """As :meth:`ReliableQueue.purge`, over every shard (``on_batch`` gets the running
        total of the logical queue)."""
        ready = later = 0
        for q in self.shards:
            before = ready + later

            def progress(n: int, before: int = before) -> None:
                if on_batch is not None:
                    on_batch(before + n)

            got = q.purge(progress, delayed=delayed, on_entries=on_entries)
            ready, later = ready + got.ready, later + got.delayed
        return Purged(ready, later)

    @_redis_errors
    def drop(self) -> bool:
        """Delete every shard, the recorded shard count and the queue's record in the
        registry. Refused (False, nothing deleted) while any shard has a message claimed."""
        if any(s["in_flight"] or s["landing"] for s in self.shard_stats().values()):
            return False
        if not all([q.drop() for q in self.shards]):
            return False
        if len(self.shards) > 1:
            self.client.hdel(self.count_key(), SHARDS_FIELD)
        Registry(self.client, self.config.prefix).forget(self.kind, self.name)
        return True
