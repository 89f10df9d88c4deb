"""The numbers of a queue, read once for every tool: ``belayq queues`` and ``watch``, the
dashboard's overview and queue page, and the exporter all show what :func:`read` (or
:func:`read_many`, the same reads batched per server) returns, so no two of them can
disagree. The framework's part comes from its adapter's ``kind`` module
(:mod:`belayq.kinds`): RQ's scheduled and failed job registries, the failed runs the
Celery and Dramatiq adapters record. docs/operations.md maps each number to the
framework's own tools.

The numbers (a :data:`Counts` dict):

* ``ready``: messages waiting to be claimed (the framework's queue length);
* ``delayed``: messages waiting for their due time: belayq's delayed set, plus those the
  framework holds back itself (RQ's ``ScheduledJobRegistry``);
* ``in_flight``: claims held (leases);
* ``dead``: dead letters;
* ``failed``: the failed jobs the framework keeps (RQ's ``FailedJobRegistry``, the failed
  runs recorded for Celery and Dramatiq); None for a kind that keeps none;
* ``failed_runs``: runs the framework reported failed (a counter: a Celery task that
  raised, an RQ job that failed, a Dramatiq actor that raised);
* ``published``: messages published: belayq's publishes (an RQ job enqueued through
  ``belayq_rq.Queue`` counts at its enqueue), plus, for a framework whose own producers
  push to the list (a stock RQ producer), each such message at its first claim;
* ``acked``: messages settled by an ack (a framework that acks a failed run, as Celery and
  RQ do, counts it here too);
* ``out``: messages that left the queue finished: acked or dead-lettered, each once. A nack
  that puts a message back is not out (and one that dead-letters it counts once);
* ``oldest_ready_s``: age of the oldest waiting message, when its publish time is known;
* ``running_for_s``: how long the longest-running claim has run (since its claim, which the
  claim's token records on the server; over the :data:`RUNNING_READ` leases soonest to
  expire, and only claims whose run started: a message a Celery worker prefetched and has
  not started is not running);
* ``paused``: whether claims are paused.

Cost: O(levels + :data:`RUNNING_READ`) per queue, never O(messages).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .admin import parse_meta, stats_of
from .blocking import node_client
from .kinds import tools_for
from .models import text as _text
from .observing import PUBLISHED_PROPERTY, published_ms_of

if TYPE_CHECKING:
    from .queue import ReliableQueue
    from .sharded import AnyQueue

#: The numbers every tool shows, in the order the CLI lists them.
NUMBERS = ("ready", "delayed", "in_flight", "dead", "failed", "failed_runs", "published",
           "acked", "out", "oldest_ready_s", "running_for_s", "paused")

#: A queue's numbers (see the module's docstring).
Counts = dict[str, Any]

#: Leases whose claims are looked at for ``running_for_s`` (the soonest to expire).
RUNNING_READ = 1000

#: The counters whose sum is "out": messages that left the queue finished.
OUT = ("acked", "dead_lettered")

#: A claim's token: ``<nonce>@<claim ms>.<position>`` (lua/includes/claiming.lua).
_CLAIMED = re.compile(r"@(\d+)\.\d+$")


def published_ms_of_entry(q: ReliableQueue, entry: bytes) -> float | None:
    """When a ready list's entry was published (ms since the epoch), if anything tells: a
    core-chosen id; a kombu envelope belayq:// stamped; the framework's own record, through
    its adapter's tools (RQ's job hash, Dramatiq's body)."""
    if not q.config.payload_in_list:
        found = published_ms_of(_text(entry))
        if found is not None:
            return found
    elif entry.startswith(b"{"):
        try:
            props = json.loads(entry).get("properties")
            return float(props[PUBLISHED_PROPERTY])
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
    of = getattr(tools_for(q.kind), "published_ms", None)
    return of(q, entry) if of is not None else None


def claimed_ms(token: str) -> int | None:
    """When the claim of ``token`` was made (ms, the server's clock); None for a token that
    does not say (a provisional lease, a claim made by an older belayq)."""
    m = _CLAIMED.search(token)
    return int(m.group(1)) if m else None


def running_ms(packed: bytes | None) -> int | None:
    """When the run of the claim a packed meta record holds started (its claim's time), or
    None when it holds no started claim that tells."""
    m = parse_meta(packed)
    if m is None or not m["started"]:
        return None
    return claimed_ms(str(m["token"]))


class Raw:
    """What one queue (or one shard) answered: its stats, observed counters, the publish
    times of its list heads, the claim times of its running claims, the server's clock."""

    def __init__(self, stats: dict[str, int], observed: dict[str, int],
                 heads_ms: list[float], running: list[int], now_ms: int) -> None:
        self.stats, self.observed = stats, observed
        self.heads_ms, self.running, self.now_ms = heads_ms, running, now_ms


def _read_part(q: ReliableQueue) -> Raw:
    """One shard's reads, in one pipeline (and one more for its leases' records)."""
    pipe = node_client(q).pipeline(transaction=False)
    pipe.time()
    pipe.execute_command(*q._scripts.command("stats"))
    pipe.hgetall(q.keys.observed)
    index = -1 if q.config.ready_head == "right" else 0
    for level in q.keys.levels:
        pipe.lindex(level, index)
    pipe.zrange(q.keys.leases, 0, RUNNING_READ - 1)
    replies = pipe.execute(raise_on_error=False)
    ids = replies[-1]
    metas = q.client.hmget(q.keys.meta, ids) if ids and isinstance(ids, list) else []
    return _raw(q, replies, metas)


def _raw(q: ReliableQueue, replies: list[Any], metas: list[Any] | Exception) -> Raw:
    """A shard's numbers from its replies (an error reply raised; the stats script's
    answered by the script runner, which loads a missing script and runs it again)."""
    for i, reply in enumerate([*replies, metas]):
        if i != 1 and isinstance(reply, Exception):
            raise reply
    assert not isinstance(metas, Exception)
    seconds, micros = replies[0]
    stats = stats_of(q._scripts.answer("stats", [], replies[1]))
    observed = {(f.decode() if isinstance(f, bytes) else str(f)): int(v)
                for f, v in replies[2].items()}
    heads = [p for h in replies[3:-1] if h is not None
             if (p := published_ms_of_entry(q, bytes(h))) is not None]
    running = [ms for packed in metas if (ms := running_ms(packed)) is not None]
    return Raw(stats, observed, heads, running, int(seconds) * 1000 + int(micros) // 1000)


def _framework(q: AnyQueue) -> dict[str, int | None]:
    """What the framework keeps itself, through its adapter's tools: ``delayed`` (what it
    holds back) and ``failed`` (None for a kind that keeps no failures)."""
    tools = tools_for(q.kind)
    counts = getattr(tools, "framework_counts", None)
    if counts is not None:
        got: dict[str, int | None] = counts(q)
        return got
    failed_count = getattr(tools, "failed_count", None)
    return {"delayed": 0, "failed": failed_count(q) if failed_count is not None else None}


def assemble(q: AnyQueue, stats: dict[str, int], parts: Sequence[Raw]) -> Counts:
    """The numbers of ``q`` from its ``stats`` (summed over shards) and each shard's
    reads."""
    observed: Counter[str] = Counter()
    for raw in parts:
        observed.update(raw.observed)
    framework = _framework(q)
    ready_ages = [(raw.now_ms - min(raw.heads_ms)) / 1000 for raw in parts if raw.heads_ms]
    running = [(raw.now_ms - min(raw.running)) / 1000 for raw in parts if raw.running]
    return {
        "ready": stats["ready"],
        "delayed": stats["delayed"] + int(framework.get("delayed") or 0),
        "in_flight": stats["in_flight"],
        "dead": stats["dead"],
        "failed": framework.get("failed"),
        "failed_runs": observed.get("failed", 0),
        "published": stats.get("published", 0) + observed.get("published", 0),
        "acked": stats.get("acked", 0),
        "out": sum(stats.get(name, 0) for name in OUT),
        "oldest_ready_s": round(max(0.0, *ready_ages), 1) if ready_ages else None,
        "running_for_s": round(max(0.0, *running), 1) if running else None,
        "paused": bool(stats.get("paused", 0)),
    }


def read(q: AnyQueue) -> Counts:
    """The numbers of ``q`` (of every shard of a sharded queue)."""
    return read_stats(q)[1]


def read_stats(q: AnyQueue) -> tuple[dict[str, int], Counts]:
    """The stats of ``q`` (:meth:`~belayq.ReliableQueue.stats`) and its numbers."""
    from .sharded import parts_of

    parts = [_read_part(p) for p in parts_of(q)]
    stats = q.stats() if len(parts) > 1 else parts[0].stats
    return stats, assemble(q, stats, parts)


def read_many(queues: Sequence[ReliableQueue]) -> list[tuple[dict[str, int], Counts | Exception]]:
    """The stats and numbers of ``queues`` (unsharded, all on one server: one client), in
    two pipelines: a page of hundreds of queues costs two round trips, and a few small reads
    per queue whose framework keeps counts of its own. A queue that cannot be read answers
    its error (stats empty)."""
    if not queues:
        return []
    pipe = queues[0].client.pipeline(transaction=False)
    index_of = []
    for q in queues:
        pipe.time()
        pipe.execute_command(*q._scripts.command("stats"))
        pipe.hgetall(q.keys.observed)
        index = -1 if q.config.ready_head == "right" else 0
        for level in q.keys.levels:
            pipe.lindex(level, index)
        pipe.zrange(q.keys.leases, 0, RUNNING_READ - 1)
        index_of.append(4 + len(q.keys.levels))
    replies = pipe.execute(raise_on_error=False)
    mine, at = [], 0
    for n in index_of:
        mine.append(replies[at:at + n])
        at += n
    pipe = queues[0].client.pipeline(transaction=False)
    asked = []
    for q, got in zip(queues, mine, strict=True):
        ids = got[-1]
        if ids and isinstance(ids, list):
            pipe.hmget(q.keys.meta, ids)
            asked.append(True)
        else:
            asked.append(False)
    metas = iter(pipe.execute(raise_on_error=False) if any(asked) else [])
    out: list[tuple[dict[str, int], Counts | Exception]] = []
    for q, got, has in zip(queues, mine, asked, strict=True):
        packed = next(metas) if has else []
        try:
            raw = _raw(q, got, packed)
            out.append((raw.stats, assemble(q, raw.stats, [raw])))
        except Exception as exc:  # shown on the queue's line by the caller
            out.append(({}, exc))
    return out


class Rates:
    """Messages in (published) and out (see :data:`OUT`) per minute of each queue, from
    the numbers read at the last two looks at least ``window_s`` apart (None until there
    are two)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], list[tuple[float, int, int]]] = {}

    def update(self, key: tuple[str, str], counts: Counts) -> tuple[float | None,
                                                                    float | None]:
        now = time.monotonic()
        sample = (now, int(counts.get("published", 0)), int(counts.get("out", 0)))
        with self._lock:
            seen = self._seen.setdefault(key, [])
            seen.append(sample)
            # Keep the newest sample at least window_s old, and those after it.
            while len(seen) > 2 and now - seen[1][0] >= self.window_s:
                seen.pop(0)
            first = seen[0]
        elapsed = now - first[0]
        if elapsed < 0.5:
            return None, None
        return (round(max(0, sample[1] - first[1]) * 60 / elapsed, 1),
                round(max(0, sample[2] - first[2]) * 60 / elapsed, 1))
