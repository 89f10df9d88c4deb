"""Producing: :meth:`publish`, :meth:`publish_result` and :meth:`publish_many` of
:class:`~belayq.ReliableQueue` (mixed into it)."""

from __future__ import annotations

import bisect
import os
import re
import time
from collections.abc import Iterable, Sequence

from .config import QueueConfig
from .config import check_count as _check_count
from .errors import ConfigError
from .errors import redis_errors as _redis_errors
from .models import Published
from .models import text as _text
from .scripts import Arg, ScriptRunner


def message_id() -> str:
    """A new message id: 12 hex digits of the publish time (ms, this client's clock), then
    80 random bits, so ids sort by publish time and tell a waiting message's age
    (:mod:`belayq.metrics`)."""
    return f"{int(time.time() * 1000):012x}{os.urandom(10).hex()}"


_MESSAGE_ID = re.compile(r"^[0-9a-f]{32}$")


def published_ms(message: str) -> int:
    """When a message whose id :func:`message_id` made was published (ms, the producer's
    clock), read from its id; 0 for an id of another form (time unknown)."""
    return int(message[:12], 16) if _MESSAGE_ID.match(message) else 0


class Publishing:
    """Storing messages, mixed into :class:`~belayq.ReliableQueue`."""

    config: QueueConfig
    _scripts: ScriptRunner

    def level_of(self, priority: int) -> int:
        """The 1-based ready level of ``priority`` (largest step not above it).

        Raises:
            ConfigError: A priority that is not an int within 0..the last step.
        """
        steps = self.config.priority_steps
        if (
            not isinstance(priority, int)
            or isinstance(priority, bool)
            or not 0 <= priority <= steps[-1]
        ):
            raise ConfigError(
                f"priority must be an int within 0..{steps[-1]} (this queue's priority_steps "
                f"are {steps!r}), got {priority!r}"
            )
        return max(1, bisect.bisect_right(steps, priority))

    def _publish_args(
        self, payload: bytes | str, priority: int, delay_ms: int, dedup_id: str | None
    ) -> list[Arg]:
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, bytes):
            raise ConfigError(f"payload must be bytes or str, got {type(payload).__name__}")
        if not isinstance(delay_ms, int) or isinstance(delay_ms, bool) or delay_ms < 0:
            raise ConfigError(f"delay_ms must be an int >= 0, got {delay_ms!r}")
        if dedup_id is not None and (not isinstance(dedup_id, str) or not dedup_id):
            raise ConfigError(f"dedup_id must be a non-empty str or None, got {dedup_id!r}")
        if dedup_id is not None and self.config.transient:
            raise ConfigError("a transient queue keeps no dedup memo: dedup_id is refused")
        return [message_id(), payload, self.level_of(priority), delay_ms, dedup_id or ""]

    def _publish_groups(
        self, groups: list[list[Arg]], before: Sequence[Arg] | None = None
    ) -> list[Published]:
        args = [a for g in groups for a in g]
        scripts, rid = self._scripts, str(groups[0][0])
        if before and not (self.config.durable or scripts.cluster):
            reply = scripts.run_after(before, "publish", self.config.dedup_window_ms, *args,
                                      request_id=rid)
        else:
            if before:
                scripts.client.execute_command(*before)
            reply = scripts.run(
                "publish", self.config.dedup_window_ms, *args, request_id=rid,
                durable=self.config.durable,
            )
        return [
            Published(_text(reply[i]), bool(int(reply[i + 1])), _text(reply[i + 2]))
            for i in range(0, len(reply), 3)
        ]

    @_redis_errors
    def publish_result(
        self,
        payload: bytes | str,
        *,
        priority: int = 0,
        delay_ms: int = 0,
        dedup_id: str | None = None,
        before: Sequence[Arg] | None = None,
    ) -> Published:
        """Store a message, and say whether it was stored (see :meth:`publish`).

        Args:
            before: A Redis command to run first, in the same round trip and transaction
                (MULTI/EXEC): an adapter's write of what the message refers to, such as
                its body under the id it publishes. A server that refuses either as it
                is queued (OOM, the ACL) applies neither; a command that fails as it runs
                (a key of another type) raises its error, the message published. With
                ``wait_replicas`` or ``wait_aof``, or on a cluster client, it is sent on
                its own, first.

        Returns:
            :class:`~belayq.models.Published`: the id, ``stored`` (False when ``dedup_id``
            suppressed it) and, if so, where the first message is now.
        """
        published = self._publish_args(payload, priority, delay_ms, dedup_id)
        if before is not None and (
            isinstance(before, (str, bytes))
            or not isinstance(before, Sequence)
            or not before
            or not all(isinstance(a, (str, bytes, int, float)) for a in before)
        ):
            raise ConfigError(
                "before must be a Redis command: a non-empty sequence of str, bytes and "
                f"numbers, got {before!r}"
            )
        return self._publish_groups([published], before)[0]

    def publish(
        self,
        payload: bytes | str,
        *,
        priority: int = 0,
        delay_ms: int = 0,
        dedup_id: str | None = None,
    ) -> str:
        """Store a message; when this returns it is in Redis (ready or delayed). A call
        re-sent after a dropped connection stores it once.

        Args:
            payload: The message (str is encoded as UTF-8).
            priority: Lower is served first, within ``0..priority_steps[-1]``.
            delay_ms: Hold the message this long before it becomes ready (ms).
            dedup_id: Within ``dedup_window_ms`` a second publish with the same id
                stores nothing and returns the first message's id (:meth:`publish_result`
                tells the two apart).

        Returns:
            The message id.

        Raises:
            ConfigError: A bad payload, priority, delay or dedup id.
            DurabilityError: ``wait_replicas`` were not confirmed (the message is stored).
        """
        return self.publish_result(
            payload, priority=priority, delay_ms=delay_ms, dedup_id=dedup_id
        ).id

    @_redis_errors
    def publish_many(
        self, payloads: Iterable[bytes | str], *, priority: int = 0, batch: int = 100
    ) -> list[str]:
        """Publish many messages, ``batch`` per script call; returns their ids in order."""
        _check_count(batch)
        groups = [self._publish_args(p, priority, 0, None) for p in payloads]
        ids: list[str] = []
        for start in range(0, len(groups), batch):
            ids += [p.id for p in self._publish_groups(groups[start : start + batch])]
        return ids
