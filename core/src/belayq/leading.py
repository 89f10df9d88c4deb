"""The lead of a queue: which one of its consumer processes answers for its delayed messages.

A framework's own view of the messages waiting for their time (Celery's ``inspect
scheduled``) asks every worker, and each answers for what it holds in memory. belayq keeps
those messages in the queue's delayed set instead, which every worker can read; were each
to list them, each would be shown once per worker. So one consumer process leads the queue
(lua/lead.lua): its sweep takes the lead when nobody holds it and renews it while it
consumes, and only that process lists the delayed set. A queue whose delayed set is empty
has nothing to lead: the call writes nothing (an idle consumer creates no key) and a lead
taken before lapses. A process that stops gives the lead
up (the others take it at their next renewal); one that dies hands it over once the lease
it was taken for (``lease_ms``) runs out. Meanwhile nobody lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .arguments import check_int
from .config import QueueConfig
from .errors import redis_errors as _redis_errors
from .holders import consumer_member
from .keys import QueueKeys
from .models import text as _text
from .scripts import ScriptRunner


@dataclass(frozen=True)
class DelayedMessage:
    """A message of the delayed set.

    Attributes:
        id: The message id.
        due_ms: When it falls due (ms since the epoch, the server's clock).
        payload: The message bytes, or None when its payload is missing.
    """

    id: str
    due_ms: int
    payload: bytes | None


class Leading:
    """The lead of a queue and the read of its delayed set (mixed into
    :class:`~belayq.ReliableQueue`)."""

    client: Any
    config: QueueConfig
    keys: QueueKeys
    _scripts: ScriptRunner

    @_redis_errors
    def lead(self, ttl_ms: int | None = None) -> bool:
        """Take or renew this process's lead of the queue for ``ttl_ms`` (default: the
        queue's ``lease_ms``), unless another process holds it.

        Nothing is written while the queue's delayed set is empty (nothing to lead): the
        call answers False then, and a lead taken before lapses at its expiry.

        Returns:
            True when this process leads the queue now; False when another process does
            or no message is delayed.

        Raises:
            ConfigError: A ``ttl_ms`` that is not an int >= 1.
        """
        ttl = self.config.lease_ms if ttl_ms is None else check_int("ttl_ms", ttl_ms, minimum=1)
        return bool(int(self._scripts.run("lead", consumer_member(), ttl)))

    @_redis_errors
    def resign(self) -> bool:
        """Give up this process's lead of the queue, if it holds it (a consumer that stops):
        another process takes it at its next :meth:`lead`, not once it expires.

        Returns:
            True when this process's lead was given up.
        """
        return bool(int(self._scripts.run("resign", consumer_member())))

    @_redis_errors
    def leader(self) -> str | None:
        """The process that leads the queue now (``"<tag> <host> <pid>"``), or None. Reads
        only."""
        found = self.client.hget(self.keys.lead, "member")
        return None if found is None else _text(found)

    def leads(self) -> bool:
        """Whether this process leads the queue now. Reads only."""
        return self.leader() == consumer_member()

    @_redis_errors
    def delayed_messages(self, limit: int = 100) -> list[DelayedMessage]:
        """The first ``limit`` messages of the delayed set, soonest due first, with their
        payloads: two reads, whatever the set's size (O(log n + limit)).

        Raises:
            ConfigError: A ``limit`` that is not an int >= 1.
        """
        check_int("limit", limit, minimum=1)
        rows = self.client.zrange(self.keys.delayed, 0, limit - 1, withscores=True)
        ids = [_text(i) for i, _ in rows]
        payloads = self.client.hmget(self.keys.payloads, ids) if ids else []
        return [DelayedMessage(i, int(due), p)
                for i, (_, due), p in zip(ids, rows, payloads, strict=True)]
