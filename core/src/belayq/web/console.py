"""What the dashboard reads and does beyond the command's listings (:mod:`belayq.cli.views`):
the overview's rates and ages, one message's detail, search by id, the framework's own
failures, and the log of what operators did to a queue.

Every read is O(queues) or O(shown), never O(messages): the overview costs a few commands
per queue, a message's detail a few per shard.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from typing import Any

from .. import lookup, readmodel
from ..admin import parse_meta
from ..blocking import node_client
from ..cli import views
from ..discovery import Found
from ..errors import CLIENT_ERROR, RESPONSE_ERROR, BelayqError, ConnectionLost, Errors
from ..kinds import console_for
from ..metrics import server_ms
from ..models import text as _text
from ..queue import ReliableQueue
from ..readmodel import Rates as Rates
from ..sharded import AnyQueue, parts_of

log = logging.getLogger("belayq")

#: The errors of a queue that cannot be read: its line says so.
_SHOWN: Errors = (BelayqError, *RESPONSE_ERROR)
#: The errors of a write to the action log after its action was done: a warning.
_LOG_ERRORS: Errors = (*CLIENT_ERROR, BelayqError)
#: Actions kept in a queue's log (newest first).
ACTIONS_KEPT = 200
#: Characters of a payload a detail shows.
PAYLOAD_CHARS = 20_000


def overview_row(found: Found, q: AnyQueue, rates: Rates) -> dict[str, Any]:
    """One queue's line of the overview: the numbers every tool shows
    (:mod:`belayq.readmodel`), and its rates in and out per minute."""
    stats, counts = readmodel.read_stats(q)
    return _row(found, q, stats, counts, rates)


def overview_rows(items: Sequence[tuple[Found, AnyQueue]], rates: Rates) -> list[dict[str, Any]]:
    """The overview's lines of ``items``, in their order. The queues of one server are read
    together (:func:`belayq.readmodel.read_many`), so a page of hundreds of queues costs a
    few round trips; a sharded queue, or one on a cluster, is read on its own
    (:func:`overview_row`). A queue that cannot be read is a line with its ``error``; a lost
    connection ends the overview."""
    rows: list[dict[str, Any] | None] = [None] * len(items)
    batches: dict[int, list[tuple[int, Found, ReliableQueue]]] = {}
    for i, (found, q) in enumerate(items):
        if isinstance(q, ReliableQueue) and hasattr(q.client, "connection_pool"):
            batches.setdefault(id(q.client), []).append((i, found, q))
        else:
            rows[i] = _guarded(found, lambda f=found, q=q: overview_row(f, q, rates))
    for batch in batches.values():
        read = readmodel.read_many([q for _, _, q in batch])
        for (i, found, q), (stats, counts) in zip(batch, read, strict=True):
            rows[i] = _guarded(found, lambda f=found, q=q, s=stats, c=counts:
                               _row(f, q, s, _raised(c), rates))
    return [row for row in rows if row is not None]


def _raised(counts: readmodel.Counts | Exception) -> readmodel.Counts:
    if isinstance(counts, Exception):
        raise counts
    return counts


def _guarded(found: Found, read: Any) -> dict[str, Any]:
    try:
        row: dict[str, Any] = read()
        return row
    except ConnectionLost:
        raise
    except _SHOWN as exc:
        return views.error_row(found, exc)


def _row(found: Found, q: AnyQueue, stats: dict[str, int], counts: readmodel.Counts,
         rates: Rates) -> dict[str, Any]:
    row = views.queue_row(found, q, (stats, counts))
    row["in_per_min"], row["out_per_min"] = rates.update(
        (found.kind, f"{found.namespace}/{found.name}" if found.namespace else found.name),
        counts)
    return row


def failed(q: AnyQueue, limit: int) -> dict[str, Any] | None:
    """The framework's own failures (RQ's failed job registry, the failed runs the Celery
    adapter records), newest first, and whether they can be requeued; None for a kind that
    keeps none."""
    tools = console_for(q.kind)
    if tools is None:
        return None
    return {"count": tools.failed_count(q), "rows": tools.failed(q, limit),
            "can_retry": hasattr(tools, "retry_failed")}


# -- one message -----------------------------------------------------------------------


def message(q: AnyQueue, message_id: str) -> dict[str, Any]:
    """Where message ``message_id`` is and what it holds: its state (ready, in flight,
    delayed, dead, or finished when a history record holds it), counts, lease left or due
    time, the payload decoded, and what the framework keeps of it. ``message_id`` is
    belayq's id or one its framework gives it (a Celery task id): see
    :mod:`belayq.lookup` for what is searched, and how far.

    Raises:
        LookupError: Neither belayq nor the framework knows the message.
    """
    out: dict[str, Any] | None = None
    for part in parts_of(q):
        hit = lookup.locate(part, message_id)
        if hit is not None:
            out = _in_part(part, *hit)
            break
    tools = console_for(q.kind)
    framework = tools.message(q, message_id) if tools is not None else None
    if out is None:
        finished = _finished(q, message_id)
        if finished is None and framework is None:
            raise LookupError(f"no message {message_id!r} in {q.name}")
        out = finished or {"id": message_id, "state": (framework or {}).get("status")
                           or "not in belayq's keys"}
    if framework is None and tools is not None and out["id"] != message_id:
        framework = tools.message(q, out["id"])
    if framework is not None:
        out["framework"] = framework
    return out


def _in_part(q: ReliableQueue, message_id: str, entry: bytes | None) -> dict[str, Any]:
    """The detail of message ``message_id`` of ``q``, which :func:`lookup.locate` found
    (``entry``: its list entry, when that is its payload)."""
    k = q.keys
    pipe = node_client(q).pipeline(transaction=False)  # TIME names no key: the queue's node
    pipe.time()
    pipe.hget(k.meta, message_id)
    pipe.hget(k.payloads, message_id)
    pipe.zscore(k.leases, message_id)
    pipe.zscore(k.delayed, message_id)
    pipe.zscore(k.dead, message_id)
    (sec, micros), packed, payload, lease, due, dead_at = pipe.execute()
    now = int(sec) * 1000 + int(micros) // 1000
    meta = parse_meta(packed)
    if payload is None:
        payload = entry
    out: dict[str, Any] = {"id": message_id, "shard": q.name if q.sharded_as else None}
    if lease is not None:
        out.update(state="in flight", lease_left_s=round((float(lease) - now) / 1000, 1))
    elif due is not None:
        out.update(state="delayed", due_in_s=round((float(due) - now) / 1000, 1))
    elif dead_at is not None:
        out.update(state="dead", dead_at_ms=int(float(dead_at)))
    else:
        out["state"] = "ready"
    if meta is not None:
        out.update({f: meta[f] for f in ("deliveries", "attempts", "level", "error")})
        if meta["published_ms"]:
            out["published_ms"] = meta["published_ms"]
    out["payload"] = decode(payload)
    return out


def _finished(q: AnyQueue, message_id: str) -> dict[str, Any] | None:
    for outcome in ("done", "failed"):
        for h in q.history(outcome, views_limit()):
            if h.id == message_id or message_id in lookup.framework_ids(q.kind, h.payload):
                return {"id": h.id, "state": "completed" if outcome == "done" else "failed",
                        "result": h.result, "reason": h.reason, "deliveries": h.deliveries,
                        "attempts": h.attempts, "published_ms": h.published_ms,
                        "finished_ms": h.finished_ms, "payload": decode(h.payload)}
    return None


def views_limit() -> int:
    """How many finished messages of each outcome a lookup reads (the page's listing)."""
    return 200


def decode(payload: bytes | None) -> dict[str, Any] | None:
    """A payload for people: a Celery task's fields (name, id, args, kwargs, retries, ETA,
    root and parent ids) from a kombu envelope, else the JSON it holds, else its text."""
    if payload is None:
        return None
    text = payload[:PAYLOAD_CHARS].decode("utf-8", "backslashreplace")
    cut = len(payload) > PAYLOAD_CHARS
    try:
        value = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return {"json": None, "text": text, "truncated": cut, "bytes": len(payload)}
    task = _celery(value)
    if task is not None:
        return {"celery": task, "bytes": len(payload)}
    return {"json": value if not cut else None, "text": None if not cut else text,
            "truncated": cut, "bytes": len(payload)}


def _celery(envelope: Any) -> dict[str, Any] | None:
    if not isinstance(envelope, dict):
        return None
    headers = envelope.get("headers")
    if not isinstance(headers, dict) or "task" not in headers:
        return None
    out = {name: headers.get(name) for name in (
        "task", "id", "retries", "eta", "expires", "root_id", "parent_id", "group", "origin",
    )}  # fmt: skip
    body: Any = envelope.get("body")
    props: Any = envelope.get("properties")
    encoding = props.get("body_encoding") if isinstance(props, dict) else None
    try:
        raw = base64.b64decode(body) if encoding == "base64" else body
        if envelope.get("content-type") == "application/json" and raw is not None:
            decoded = json.loads(raw)
            if isinstance(decoded, list) and len(decoded) >= 2:  # protocol 2
                out["args"], out["kwargs"] = decoded[0], decoded[1]
            elif isinstance(decoded, dict):  # protocol 1
                out["args"], out["kwargs"] = decoded.get("args"), decoded.get("kwargs")
        else:
            out["body"] = f"({envelope.get('content-type')}, not shown)"
    except (ValueError, TypeError) as exc:
        out["body"] = f"(cannot be decoded: {exc})"
    return out


# -- search ------------------------------------------------------------------------------


def search(queues: Sequence[tuple[Found, AnyQueue]], message_id: str) -> list[dict[str, Any]]:
    """The queues that know message ``message_id`` now (belayq's id, or its framework's: a
    Celery task id, an RQ job id, a Dramatiq ``message_id``), its state in each, and its
    id in belayq: a few bounded commands per queue (:mod:`belayq.lookup`)."""
    hits = []
    for found, q in queues:
        try:
            detail = message(q, message_id)
        except LookupError:
            continue
        hit = {"kind": found.kind, "queue": found.name, "state": detail["state"],
               "id": detail["id"]}
        if found.namespace:  # which of two apps' queues of this name
            hit["namespace"] = found.namespace
        hits.append(hit)
    return hits


# -- the log of actions ------------------------------------------------------------------


def record(q: AnyQueue, action: str, detail: dict[str, Any], by: str) -> bool:
    """Add what an operator did to the queue's log (the newest :data:`ACTIONS_KEPT`), after
    the action was done. The log is best-effort: a write the server refuses (a full server
    under ``noeviction``) or that is lost is a warning in this process's log, never an error
    of the action, which is done. Returns whether the entry was written."""
    first = parts_of(q)[0]
    try:
        entry = json.dumps({"ms": server_ms(first), "action": action, "by": by, **detail},
                           separators=(",", ":"), default=str)
        pipe = first.client.pipeline(transaction=False)
        pipe.lpush(first.keys.actions, entry)
        pipe.ltrim(first.keys.actions, 0, ACTIONS_KEPT - 1)
        pipe.execute()
    except _LOG_ERRORS as exc:
        log.warning("queue %r (%s): the %s by %s was done, but its entry in the queue's "
                    "action log was not written: %s", q.name, q.kind, action, by, exc)
        return False
    return True


def actions(q: AnyQueue, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` actions of the queue's log."""
    first = parts_of(q)[0]
    out = []
    for raw in first.client.lrange(first.keys.actions, 0, limit - 1):
        try:
            out.append(json.loads(_text(raw)))
        except ValueError:
            continue
    return out
