"""Producing: :meth:`publish`, :meth:`publish_result` and :meth:`publish_many` of
:class:`~belayq.ReliableQueue` (mixed into it)."""

from __future__ import annotations

import bisect
import os
import re
import time
from collections.abc import Iterable

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


_new_id = message_id  # publish_result's argument of the same name hides it there

_MESSAGE_ID = re.compile(r"^[0-9a-f]{32}$")

#: An id a caller chooses (``publish_result(message_id=...)``): printable ASCII, no spaces.
_CALLER_ID = re.compile(r"^[!-~]{1,128}$")


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
        self, payload: bytes | str, priority: int, delay_ms: int, dedup_id: str | None,
        chosen_id: str | None = None,
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
        if chosen_id is not None:
            if self.config.payload_in_list:
                raise ConfigError("message_id is for queues whose list holds ids; this "
                                  "queue's entries are the payloads, which are their own ids")
            if not isinstance(chosen_id, str) or not _CALLER_ID.match(chosen_id):
                raise ConfigError("message_id must be 1 to 128 printable ASCII characters "
                                  f"without spaces, got {chosen_id!r}")
        return [chosen_id or message_id(), payload, self.level_of(priority), delay_ms,
                dedup_id or ""]

    def _publish_groups(self, groups: list[list[Arg]], request_id: str = "",
                        trace_context: str = "") -> list[Published]:
        """Publish ``groups`` in one script call; a re-send of the call answers as the first
        did, by ``request_id`` (the first message's id, new and random, by default).
        ``trace_context`` (``belayq.otel``), when given, is stored with each message by the
        same call, or counted as ``untraced`` when it cannot be."""
        args = [a for g in groups for a in g]
        if trace_context:
            args.append(trace_context)
        reply = self._scripts.run(
            "publish", self.config.dedup_window_ms, *args,
            request_id=request_id or str(groups[0][0]), durable=self.config.durable,
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
        message_id: str | None = None,
    ) -> Published:
        """Store a message, and say whether it was stored (see :meth:`publish`).

        Args:
            message_id: Publish under this id instead of a new one, for a framework whose
                producers name their messages (a queue whose list holds ids). While a
                message of that id is in the queue (waiting, claimed or dead) nothing is
                stored: ``stored`` is False and ``state`` says where it is. A message
                published so carries no publish time in its id (see :func:`published_ms`).

        Returns:
            :class:`~belayq.models.Published`: the id, ``stored`` (False when ``dedup_id``
            or ``message_id`` found a message) and, if so, where that message is now.
        """
        published = self._publish_args(payload, priority, delay_ms, dedup_id, message_id)
        # A chosen id may be published again once settled: each call is told apart by an id
        # of its own, so only a re-send of this call answers as this one did.
        return self._publish_groups([published], "" if message_id is None else _new_id())[0]

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
