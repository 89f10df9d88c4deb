"""What the measurements start from: payloads, an empty database, a fresh queue; and the
invariant checks that make a broken loop fail loudly instead of printing a number."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import redis

from belayq import ReliableQueue

# The raw floor's keys: ready list, processing list, lease zset.
RAW_Q, RAW_P, RAW_LEASE = "raw:q", "raw:p", "raw:lease"


def make_payloads(n: int, size: int, tag: bytes) -> list[bytes]:
    return [(b"%s-%08d-" % (tag, i)).ljust(size, b"x")[:size] for i in range(n)]


def chunks(seq: Sequence[bytes], size: int) -> list[Sequence[bytes]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


def fresh(r: redis.Redis) -> None:
    """Empty the database (scripts stay cached) between loops, outside the timing."""
    r.flushdb(asynchronous=False)


def need(cond: bool, what: str) -> None:
    if not cond:
        raise RuntimeError(f"benchmark invariant broken: {what}")


def queue(r: redis.Redis, **options: Any) -> ReliableQueue:
    return ReliableQueue(r, f"bench-{uuid.uuid4().hex[:8]}", **options)


def check_drained(q: ReliableQueue) -> None:
    s = q.stats()
    need(s["ready"] == 0 and s["in_flight"] == 0 and s["leased"] == 0, f"drained: {s}")
