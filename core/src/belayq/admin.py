"""Inspection and administration of a queue: stats, dead letters, replay, purge, drop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._support import redis_errors as _redis_errors
from ._support import text as _text
from .keys import QueueKeys
from .models import DeadLetter
from .scripts import ScriptRunner


class QueueAdmin:
    """Read-mostly operations of :class:`~belayq.ReliableQueue` (mixed into it)."""

    client: Any
    keys: QueueKeys
    _scripts: ScriptRunner

    @_redis_errors
    def stats(self) -> dict[str, int]:
        """Sizes (ready, in_flight, leased, delayed, dead) and every counter."""
        r = self._scripts.run("stats")
        names = ("ready", "in_flight", "leased", "delayed", "dead")
        out = dict(zip(names, map(int, r[:5]), strict=True))
        for i in range(5, len(r), 2):
            out[_text(r[i])] = int(r[i + 1])
        return out

    @_redis_errors
    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest ``limit`` dead letters with their reasons."""
        ids = [_text(i) for i in self.client.lrange(self.keys.dead, 0, limit - 1)]
        pipe = self.client.pipeline(transaction=False)
        for i in ids:
            pipe.hmget(self.keys.message(i), "p", "e", "n", "d")
        out = []
        for i, (p, e, n, d) in zip(ids, pipe.execute(), strict=True):
            out.append(DeadLetter(i, p, _text(e or b""), int(n or 0), int(d or 0)))
        return out

    @_redis_errors
    def replay_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """Put dead letters back on their ready lists (all of them, oldest first, up to
        ``limit``, when ``ids`` is None); returns how many were replayed."""
        return int(self._scripts.run("replay", limit, *(ids or [])))

    @_redis_errors
    def purge(self) -> int:
        """Delete every waiting (ready or delayed) message; returns how many."""
        return int(self._scripts.run("purge"))

    @_redis_errors
    def drop(self) -> bool:
        """Delete the queue: its waiting messages, dead letters, counters and every key of
        its own. Refused (False, nothing deleted) while any message is claimed, since the
        claims' tokens come from the queue's counters."""
        return bool(int(self._scripts.run("drop")))
