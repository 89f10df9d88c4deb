"""Failed runs a framework does not keep itself, recorded by its adapter for the tools.

Celery acks a task that raised like one that succeeded, and keeps its traceback only in a
result backend, when one is set and the task's result is not ignored. So the Celery adapter
records each failed run here, from the process that ran it: the task, its arguments, the
exception and its traceback. The dashboard lists them beside the queue, opens each one, and
deletes them; the metrics count them (``belayq_framework_failed``).

A queue keeps the newest :data:`KEPT` records, in two keys in its slot (of a sharded queue,
its first shard's): a hash of JSON records by job id, and a sorted set of the ids by when
each failed. A job that fails again replaces its record. Both keys expire
:data:`KEEP_MS` after the last failure, and go with the queue when it is dropped.
"""

from __future__ import annotations

import json
from typing import Any

from .models import text as _text
from .sharded import AnyQueue, parts_of

#: Records kept per queue (the newest).
KEPT = 1000
#: How long the records outlive the last failure (ms): a week.
KEEP_MS = 7 * 24 * 3600 * 1000
#: A record's longest text (a traceback, an argument list), in characters; longer is cut.
MAX_TEXT = 16_384


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + f"… ({len(value) - MAX_TEXT} more characters)"
    return value


def record(q: AnyQueue, job_id: str, failed_at_ms: int, fields: dict[str, Any],
           pipe: Any = None) -> None:
    """Queue on ``pipe`` (or write at once) the record of job ``job_id``'s failed run:
    ``fields`` (JSON values; texts longer than :data:`MAX_TEXT` are cut) with ``id`` and
    ``failed_at_ms``. Records beyond :data:`KEPT` are trimmed by :func:`trim`."""
    k = parts_of(q)[0].keys
    body = {key: _cut(value) for key, value in fields.items()}
    body.update(id=job_id, failed_at_ms=failed_at_ms)
    own = pipe is None
    if own:
        pipe = parts_of(q)[0].client.pipeline(transaction=False)
    pipe.hset(k.failures, job_id, json.dumps(body, default=repr, separators=(",", ":")))
    pipe.zadd(k.failures_at, {job_id: failed_at_ms})
    pipe.pexpire(k.failures, KEEP_MS)
    pipe.pexpire(k.failures_at, KEEP_MS)
    if own:
        pipe.execute()
        trim(q)


def trim(q: AnyQueue) -> int:
    """Delete the oldest records beyond :data:`KEPT`; how many were deleted."""
    first = parts_of(q)[0]
    c, k = first.client, first.keys
    over = c.zcard(k.failures_at) - KEPT
    if over <= 0:
        return 0
    old = [_text(i) for i in c.zrange(k.failures_at, 0, over - 1)]
    if old:
        pipe = c.pipeline(transaction=False)
        pipe.zrem(k.failures_at, *old)
        pipe.hdel(k.failures, *old)
        pipe.execute()
    return len(old)


def count(q: AnyQueue) -> int:
    """How many failed runs are recorded."""
    first = parts_of(q)[0]
    return int(first.client.zcard(first.keys.failures_at))


def newest(q: AnyQueue, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` records, newest first."""
    first = parts_of(q)[0]
    c, k = first.client, first.keys
    ids = [_text(i) for i in c.zrevrange(k.failures_at, 0, limit - 1)]
    if not ids:
        return []
    return [json.loads(raw) for raw in c.hmget(k.failures, ids) if raw is not None]


def get(q: AnyQueue, job_id: str) -> dict[str, Any] | None:
    """Job ``job_id``'s record, or None."""
    first = parts_of(q)[0]
    raw = first.client.hget(first.keys.failures, job_id)
    return json.loads(raw) if raw is not None else None


class RecordedFailures:
    """The dashboard's part (:class:`belayq.kinds.KindConsole`) for a kind whose adapter
    records its failed runs here: count, list, open and delete them. No ``retry_failed``:
    the framework's own retry policy requeues its jobs, so the dashboard offers no requeue
    and says why."""

    def failed_count(self, queue: AnyQueue) -> int:
        return count(queue)

    def failed(self, queue: AnyQueue, limit: int) -> list[dict[str, Any]]:
        return [{"id": r["id"], "task": r.get("task"), "failed_at_ms": r.get("failed_at_ms"),
                 "reason": r.get("reason")} for r in newest(queue, limit)]

    def delete_failed(self, queue: AnyQueue, ids: list[str]) -> int:
        return discard(queue, ids)

    def message(self, queue: AnyQueue, message_id: str) -> dict[str, Any] | None:
        """The record of job ``message_id``'s last failed run (None when none is kept)."""
        found = get(queue, message_id)
        return None if found is None else {**found, "status": "failed"}


def discard(q: AnyQueue, job_ids: list[str]) -> int:
    """Delete the records of ``job_ids``; how many there were."""
    if not job_ids:
        return 0
    first = parts_of(q)[0]
    c, k = first.client, first.keys
    pipe = c.pipeline(transaction=False)
    pipe.zrem(k.failures_at, *job_ids)
    pipe.hdel(k.failures, *job_ids)
    removed, _ = pipe.execute()
    return int(removed)
