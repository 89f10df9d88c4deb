"""What the ``belayq`` command shows: in-flight, delayed and dead messages, a table of
queues, and the live view of ``watch``. Reads only; O(shown), never O(queue)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import zip_longest
from typing import Any

from .. import readmodel
from ..admin import BELL
from ..discovery import Found
from ..errors import RESPONSE_ERROR, BelayqError, ConnectionLost, Errors
from ..kinds import tools_for
from ..metrics import server_ms
from ..models import entry_id
from ..models import text as _text
from ..queue import ReliableQueue
from ..sharded import AnyQueue, parts_of

#: The errors shown to the user (a queue that cannot be read, an unreachable server).
_SHOWN: Errors = (BelayqError, *RESPONSE_ERROR)

#: Characters of a payload shown in a listing.
PREVIEW_CHARS = 120
#: A ready entry longer than this is a payload (a stock producer's), not a message id.
MAX_ID_CHARS = 200


def describe(payload: bytes | None) -> dict[str, Any]:
    """What a payload says about itself: a Celery task's name and id (a kombu envelope),
    else a preview."""
    if payload is None:
        return {"payload": None}
    try:
        envelope = json.loads(payload)
        headers = envelope.get("headers") if isinstance(envelope, dict) else None
        if isinstance(headers, dict) and "task" in headers:
            return {"task": headers["task"], "task_id": headers.get("id")}
    except (ValueError, UnicodeDecodeError):
        pass
    text = payload[:PREVIEW_CHARS].decode("utf-8", "backslashreplace")
    return {"payload": text + ("..." if len(payload) > PREVIEW_CHARS else "")}


def in_flight(q: AnyQueue, limit: int) -> list[dict[str, Any]]:
    """The claims held, soonest to expire first: lease time left, how long each has run,
    deliveries, runs, the consumer that holds each (``host:pid``, when it registered) and
    what the payload says; over every shard of a sharded queue."""
    rows = [row for p in parts_of(q) for row in _in_flight(p, limit)]
    return sorted(rows, key=lambda row: float(row["lease_left_s"]))[:limit]


def _in_flight(q: ReliableQueue, limit: int) -> list[dict[str, Any]]:
    now = server_ms(q)
    leases = q.in_flight(limit)
    ids = [lease.id for lease in leases]
    payloads = q.client.hmget(q.keys.payloads, ids) if ids else []
    return [{
        "id": lease.id, "lease_left_s": round((lease.deadline_ms - now) / 1000, 1),
        "running_for_s": _running_for(lease.token, lease.started, now),
        "deliveries": lease.deliveries, "attempts": lease.attempts, "started": lease.started,
        "provisional": lease.provisional, "held_by": lease.holder, **describe(payload),
    } for lease, payload in zip(leases, payloads, strict=True)]  # fmt: skip


def _running_for(token: str, started: bool, now_ms: int) -> float | None:
    """How long a claim has run (s, since its claim; None when its run has not started or
    its token does not tell)."""
    claimed = readmodel.claimed_ms(token) if started else None
    return None if claimed is None else round(max(0, now_ms - claimed) / 1000, 1)


def ready(q: AnyQueue, limit: int) -> list[dict[str, Any]]:
    """The next ``limit`` messages to be claimed, highest priority level first (a level
    list holds ids of messages whose payload belayq keeps, or a stock producer's entries
    themselves); of a sharded queue, each shard's next ones in turn (shards keep no common
    order)."""
    per = [_ready(p, limit) for p in parts_of(q)]
    return [row for rank in zip_longest(*per) for row in rank if row is not None][:limit]


def _ready(q: ReliableQueue, limit: int) -> list[dict[str, Any]]:
    left = q.config.ready_head == "left"
    pipe = q.client.pipeline(transaction=False)
    for level in q.keys.levels:
        pipe.lrange(level, 0, limit - 1) if left else pipe.lrange(level, -limit, -1)
    entries = [e for got in pipe.execute() for e in (got if left else reversed(got))
               if e != BELL][:limit]
    if q.config.payload_in_list:  # the entries are the messages, known by their own ids
        return [{"id": entry_id(e, True), **describe(e)} for e in entries]
    ids = [_text(e) if len(e) <= MAX_ID_CHARS else "" for e in entries]
    payloads = q.client.hmget(q.keys.payloads, ids) if ids else []
    return [{"id": i if p is not None else None, **describe(p if p is not None else e)}
            for i, e, p in zip(ids, entries, payloads, strict=True)]


def delayed(q: AnyQueue, limit: int) -> list[dict[str, Any]]:
    """The delayed messages, soonest due first (over every shard of a sharded queue), with
    those the queue's framework holds back itself (RQ's scheduled jobs, through its
    adapter's tools: :mod:`belayq.kinds`)."""
    rows = [row for p in parts_of(q) for row in _delayed(p, limit)]
    framework_delayed = getattr(tools_for(q.kind), "delayed", None)
    if framework_delayed is not None:
        rows += framework_delayed(q, limit)
    return sorted(rows, key=lambda row: float(row["due_in_s"]))[:limit]


def _delayed(q: ReliableQueue, limit: int) -> list[dict[str, Any]]:
    now = server_ms(q)
    rows = q.client.zrange(q.keys.delayed, 0, limit - 1, withscores=True)
    ids = [_text(i) for i, _ in rows]
    payloads = q.client.hmget(q.keys.payloads, ids) if ids else []
    return [{"id": _text(raw_id), "due_in_s": round((due - now) / 1000, 1), **describe(p)}
            for (raw_id, due), p in zip(rows, payloads, strict=True)]


def dead(q: AnyQueue, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` dead letters: reason, counts, when (``dead_at_ms``)."""
    return [{"id": d.id, "reason": d.reason, "deliveries": d.deliveries,
             "attempts": d.attempts, "dead_at_ms": d.dead_at_ms, **describe(d.payload)}
            for d in q.dead_letters(limit)]


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain text table of ``columns`` (absent values shown as ``-``)."""
    cells = [[str(r.get(c, "-")) if r.get(c) is not None else "-" for c in columns]
             for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


#: The columns of ``belayq queues`` and ``watch``: the numbers every tool shows
#: (:mod:`belayq.readmodel`), and two of the counters.
QUEUE_COLUMNS = ("kind", "queue", "ready", "delayed", "in_flight", "dead", "failed",
                 "published", "acked", "out", "reclaimed", "dead_lettered", "running_for_s")


#: The figures ``belayq stats`` shows for each shard of a sharded queue.
SHARD_COLUMNS = ("ready", "in_flight", "delayed", "dead", "acked")


def queue_rows(
    found: Sequence[Found], open_one: Callable[[Found], AnyQueue]
) -> list[dict[str, Any]]:
    """The lines of ``found`` queues; one that cannot be read (written by another belayq
    version, or its keys taken by other data) is a line with its ``error``, never the end of
    the listing. A lost connection ends it."""
    rows = []
    for f in found:
        try:
            rows.append(queue_row(f, open_one(f)))
        except ConnectionLost:
            raise
        except _SHOWN as exc:
            rows.append(error_row(f, exc))
    return rows


def queue_columns(rows: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The columns of a queue listing: an ``error`` column when a line has one."""
    columns: tuple[str, ...] = QUEUE_COLUMNS
    if any(r.get("namespace") for r in rows):  # apps apart by their namespace share the server
        columns = (*columns[:2], "namespace", *columns[2:])
    return (*columns, "error") if any("error" in r for r in rows) else columns


def queue_row(found: Found, q: AnyQueue,
              read: tuple[dict[str, int], readmodel.Counts] | None = None) -> dict[str, Any]:
    """One queue's line of ``belayq queues``, ``watch`` and the dashboard's overview: the
    numbers every tool shows (:mod:`belayq.readmodel`) and two counters of the stats hash
    (``read``: the queue's stats and numbers, when already read)."""
    stats, counts = readmodel.read_stats(q) if read is None else read
    row = {"kind": found.kind, "queue": q.name, "shards": stats.get("shards", 1),
           "recorded": found.recorded, "reclaimed": stats.get("reclaimed", 0),
           "dead_lettered": stats.get("dead_lettered", 0), **counts}
    if found.namespace:  # apps apart by their namespace share the server
        row["namespace"] = found.namespace
    return row


def error_row(found: Found, exc: BaseException) -> dict[str, Any]:
    """The line of a queue that could not be read: what names it, and the error."""
    row = {"kind": found.kind, "queue": found.name, "recorded": found.recorded,
           "error": f"{type(exc).__name__}: {exc}"}
    if found.namespace:
        row["namespace"] = found.namespace
    return row


def dead_ids(q: AnyQueue, ids: Iterable[str]) -> set[str]:
    """Which of ``ids`` are dead letters of ``q`` now (of any shard)."""
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return set()
    found: set[str] = set()
    for p in parts_of(q):
        scores = p.client.zmscore(p.keys.dead, wanted)
        found.update(i for i, score in zip(wanted, scores, strict=True) if score is not None)
    return found


def when(ms: int | None) -> str | None:
    """A time in ms since the epoch as this host's local time (None when unknown)."""
    if not ms:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def duration(ms: int) -> str:
    """``ms`` for people: 1500 -> 1.5 s, 86400000 -> 24 h."""
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if ms >= size:
            return f"{ms / size:g} {unit}"
    return f"{ms} ms"


#: The settings ``belayq stats`` shows, as the registry records them.
SETTINGS = ("lease_ms", "max_deliveries", "dead_letter_max", "exhausted", "history_max",
            "history_ttl_ms", "events")


def settings(found: Found) -> dict[str, Any] | None:
    """The settings the queue's processes recorded; None when none did (only its framework
    knows the queue)."""
    rec = found.record
    if rec is None:
        return None
    return {name: getattr(rec, name) for name in SETTINGS}


def unrecorded(found: Found) -> str:
    """What it means that no belayq process recorded ``found``'s settings."""
    return (f"{found.name} ({found.kind}) has no recorded settings: no belayq process has "
            "opened it, so nothing claims, settles or sweeps it with belayq's rules yet")


def history_note(found: Found, shown: int) -> str | None:
    """Whether the queue keeps a history, when the listing needs it said (``shown``: how
    many finished messages were listed)."""
    rec = found.record
    if rec is None:
        return None if shown else unrecorded(found) + "; whether it keeps a history is unknown"
    if rec.history_max is None:
        return None if shown else (f"whether {found.name} keeps a history is not recorded "
                                   "(its record was written by an older belayq)")
    if rec.history_max == 0:
        kept = "; these were kept before it was turned off" if shown else ": nothing is kept"
        return (f"history is off for {found.name} (history_max 0){kept}. Its consumers keep "
                "the last N finished messages when they open the queue with history_max=N")
    if shown:
        return None
    ttl = f" for {duration(rec.history_ttl_ms)}" if rec.history_ttl_ms else ""
    return (f"no finished message is kept now: {found.name} keeps the last "
            f"{rec.history_max} of each outcome{ttl} after the latest")


def dead_note(found: Found, shown: int, dead_now: int) -> str | None:
    """What the listing of the queue's dead letters needs said: a queue that hands its
    messages out of runs to its consumers (``exhausted="deliver"``), one at its cap, one
    whose settings are not recorded."""
    rec = found.record
    if rec is None:
        return None if shown else unrecorded(found)
    if rec.exhausted == "deliver":
        return deliver_note(found)
    if dead_now >= rec.dead_letter_max:
        return (f"{found.name} keeps its newest {rec.dead_letter_max} dead letters "
                "(dead_letter_max): older ones were deleted")
    return None


def deliver_note(found: Found) -> str | None:
    """What a queue that hands its messages out of runs to its consumers
    (``exhausted="deliver"``) dead-letters; None for any other queue."""
    if found.record is None or found.record.exhausted != "deliver":
        return None
    return (f"{found.name} hands a message out of runs to its consumer once more "
            "(exhausted=deliver), which records the failure itself (RQ: its "
            "FailedJobRegistry, `rq info`): only messages whose last claim was lost too, or "
            "that could not be read, are dead-lettered here")
