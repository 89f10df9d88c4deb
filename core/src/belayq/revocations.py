"""Revocations: which ids (a host's own: Celery task ids) must not run, kept in Redis.

A message may wait for its due time far longer than any consumer's memory of a revoke lasts
(a Celery worker forgets a revoke after 3 hours, or 50,000 revokes, or a restart). The
record here is seen by every consumer whenever the message comes due. It is bounded: each
revoke drops the ids revoked more than ``keep_ms`` ago (by the server's clock), and the
oldest beyond ``max_ids``; an id is forgotten once a consumer has acted on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import ConfigError
from .errors import redis_errors as _redis_errors
from .keys import revocations_key

#: How long a revoke is remembered by default (ms): a week, longer than most ETAs.
KEEP_MS = 7 * 24 * 3600 * 1000

#: How many revokes are remembered at most by default (Celery's REVOKES_MAX).
MAX_IDS = 50_000


class Revocations:
    """The revoked ids under one key prefix.

    Args:
        client: A ``redis.Redis`` or ``redis.cluster.RedisCluster`` (one key: any node).
        prefix: The key prefix of the queues whose messages the ids name.
        keep_ms: Revokes older than this are dropped at the next revoke (ms).
        max_ids: At most this many revokes are kept (the oldest go first).
    """

    def __init__(
        self, client: Any, *, prefix: str = "belayq", keep_ms: int = KEEP_MS,
        max_ids: int = MAX_IDS,
    ) -> None:
        for name, value in (("keep_ms", keep_ms), ("max_ids", max_ids)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        self.client = client
        self.key = revocations_key(prefix)
        self.keep_ms = keep_ms
        self.max_ids = max_ids

    @_redis_errors
    def revoke(self, ids: Iterable[str]) -> None:
        """Remember ``ids`` as revoked (stamped with the server's clock), and drop what is
        past ``keep_ms`` or beyond ``max_ids``."""
        wanted = [str(i) for i in ids]
        if not wanted:
            return
        seconds, micros = self.client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        with self.client.pipeline(transaction=True) as pipe:
            pipe.zadd(self.key, dict.fromkeys(wanted, now_ms))
            pipe.zremrangebyscore(self.key, "-inf", now_ms - self.keep_ms)
            pipe.zremrangebyrank(self.key, 0, -(self.max_ids + 1))
            pipe.execute()

    @_redis_errors
    def revoked(self, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` are revoked (one ZMSCORE)."""
        wanted = list(dict.fromkeys(str(i) for i in ids))
        if not wanted:
            return set()
        scores = self.client.zmscore(self.key, wanted)
        return {i for i, score in zip(wanted, scores, strict=True) if score is not None}

    @_redis_errors
    def forget(self, ids: Iterable[str]) -> None:
        """Drop ``ids`` (their messages have been dealt with)."""
        wanted = [str(i) for i in ids]
        if wanted:
            self.client.zrem(self.key, *wanted)
