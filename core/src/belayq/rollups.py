"""Per-minute history of a queue's counters, kept in Redis for a day (the dashboard's graph).

Once a minute, each process that keeps leases on a queue (its lease keeper's beat) writes
a snapshot of the queue's counters under the server's current minute, unless a process did
so already for that minute or nothing changed since the snapshot it last wrote or read. So
an idle queue writes nothing (and an idle consumer creates no key), and a fleet of any size
writes one snapshot per minute. The snapshots live in one hash per queue
(``<queue prefix>rollups``, in the queue's slot): field the minute, value the counters. It
keeps the last :data:`KEEP_MINUTES` and expires a day after its last write.

:func:`history` turns the snapshots into counts per minute: a gap between two snapshots
(no process sampled, or nothing changed) spreads the difference over the minutes between.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

from .blocking import node_client
from .errors import CLUSTER_ERROR, CONNECTION_ERROR, REDIRECTS, RESPONSE_ERROR
from .kinds import tools_for
from .models import text as _text

if TYPE_CHECKING:
    from .queue import ReliableQueue
    from .sharded import AnyQueue

log = logging.getLogger("belayq")

#: The counters of the stats hash kept each minute, in the order a snapshot stores them.
COUNTERS = ("published", "claimed", "acked", "nacked", "reclaimed", "adopted",
            "dead_lettered", "stale_acks")
#: The counters of the observed hash (:mod:`belayq.observing`) a snapshot stores after
#: them: the runs the framework reported failed, and the messages its own producers
#: published (counted at their first claim).
OBSERVED = ("failed", "published")
#: Everything a snapshot stores, in order (a snapshot written before the observed counters
#: were kept has the first ones only: the others read 0).
SNAPSHOT = (*COUNTERS, "failed", "published_seen")
#: What :func:`history` answers for each minute, besides ``t``: the counters (``published``
#: counts both kinds of publish), ``failed`` (failed runs) and ``completed`` (runs that did
#: not fail: acked, less the failed runs a framework acks, as Celery and RQ ack every one;
#: a framework whose run that gave up is dead-lettered instead, as Dramatiq's is, says so
#: in its adapter's tools: ``failed_runs_dead_lettered``, see :mod:`belayq.kinds`).
PER_MINUTE = (*COUNTERS, "failed", "completed")
#: Minutes kept (a day).
KEEP_MINUTES = 1440
#: A snapshot hash holding this many minutes more than it keeps is trimmed.
TRIM_SLACK = 60
MINUTE_MS = 60_000


def _counters(values: list[Any]) -> tuple[int, ...]:
    return tuple(int(v) if v is not None else 0 for v in values)


def record_minute(q: ReliableQueue, last: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Write the snapshot of ``q``'s counters for the server's current minute, unless one
    is there, the queue never counted anything, or the counters equal ``last`` (what this
    process last wrote or read). Returns the counters read (None when it could not read).
    A server that refuses the commands (an ACL) is logged once per queue, and changes
    nothing; a server away, or a cluster slot on the move, leaves the minute to the next
    beat."""
    if q.config.transient:
        return last
    client = q.client
    key = q.keys.rollups
    try:
        # TIME names no key, so a cluster client cannot pipeline it: it is asked of the
        # node that holds the queue, in the same pipeline as the counters.
        pipe = node_client(q).pipeline(transaction=False)
        pipe.time()
        pipe.hmget(q.keys.stats, list(COUNTERS))
        pipe.hmget(q.keys.observed, list(OBSERVED))
        (seconds, micros), values, seen = pipe.execute()
        counters = _counters([*values, *seen])
        if counters == last or not any(counters):
            return counters
        minute = (int(seconds) * 1000 + int(micros) // 1000) // MINUTE_MS
        pipe = client.pipeline(transaction=False)
        pipe.hsetnx(key, str(minute), " ".join(map(str, counters)))
        pipe.pexpire(key, (KEEP_MINUTES + TRIM_SLACK) * MINUTE_MS)
        pipe.hlen(key)
        _, _, size = pipe.execute()
        if size > KEEP_MINUTES + TRIM_SLACK:
            old = [f for f in map(_text, client.hkeys(key))
                   if f.isdigit() and int(f) <= minute - KEEP_MINUTES]
            if old:
                client.hdel(key, *old)
        return counters
    except (*REDIRECTS, *CLUSTER_ERROR, *CONNECTION_ERROR):
        return last
    except RESPONSE_ERROR as exc:
        if not getattr(q, "_rollups_refused", False):
            q._rollups_refused = True  # type: ignore[attr-defined]
            log.warning("queue %s keeps no per-minute history: %s", q.name, exc)
        return last


def history(q: AnyQueue, minutes: int = KEEP_MINUTES) -> list[dict[str, int]]:
    """The counts per minute over the last ``minutes`` with snapshots (over every shard of a
    sharded queue): ``t`` (the minute's start, ms since the epoch) and, for each of
    :data:`PER_MINUTE`, how many it counted in that minute. Minutes before the first snapshot
    are left out."""
    totals: dict[int, dict[str, float]] = {}
    parts: tuple[ReliableQueue, ...] = getattr(q, "shards", None) or (q,)  # type: ignore[assignment]
    for part in parts:
        for minute, counts in _per_minute(part, minutes).items():
            row = totals.setdefault(minute, dict.fromkeys(SNAPSHOT, 0.0))
            for name, value in counts.items():
                row[name] += value
    # The failed runs that were not acked: those dead-lettered, where the framework's last
    # failed run of a message is (Dramatiq's).
    dead_failed = bool(getattr(tools_for(q.kind), "failed_runs_dead_lettered", False))
    out = []
    for minute, row in sorted(totals.items()):
        row["published"] += row.pop("published_seen")
        acked_failed = row["failed"] - (row["dead_lettered"] if dead_failed else 0)
        row["completed"] = min(row["acked"], max(0.0, row["acked"] - acked_failed))
        out.append({"t": minute * MINUTE_MS, **{n: round(row[n]) for n in PER_MINUTE}})
    return out


def _per_minute(q: ReliableQueue, minutes: int) -> dict[int, dict[str, float]]:
    raw = q.client.hgetall(q.keys.rollups)
    snaps = sorted((int(_text(f)), _counters(_text(v).split()))
                   for f, v in raw.items() if _text(f).isdigit())
    if not snaps:
        return {}
    newest = snaps[-1][0]
    out: dict[int, dict[str, float]] = {}
    for (m0, c0), (m1, c1) in itertools.pairwise(snaps):
        gap = m1 - m0
        for m in range(m0 + 1, m1 + 1):
            if m > newest - minutes:
                out[m] = {n: _step(c0, c1, i) / gap for i, n in enumerate(SNAPSHOT)}
    return out


def _step(c0: tuple[int, ...], c1: tuple[int, ...], i: int) -> int:
    """How much the ``i``-th counter counted between two snapshots; 0 when either was
    written before that counter was kept (its total so far is not one minute's count)."""
    return max(0, c1[i] - c0[i]) if i < len(c0) and i < len(c1) else 0
