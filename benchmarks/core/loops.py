"""The throughput loops, as a table.

Each :class:`Loop` names its setup (run outside the timing: it empties the database, may
fill the raw list or a belayq queue, and returns what the body works on: the queue, the
loaded Lua script, or None), its timed body, and the invariant checked afterwards. One rep
runs :data:`LOOPS` in order, belayq and raw interleaved, so that neighbours in time are
compared. A raw loop also names the report rows in which it is the floor of a belayq loop.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from belayq import ReliableQueue

from .counting import Sample, measure
from .fixtures import (
    RAW_LEASE,
    RAW_P,
    RAW_Q,
    check_drained,
    chunks,
    fresh,
    make_payloads,
    need,
    queue,
)

RAW_CLAIM_LUA = (
    "local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT') "
    "if v then redis.call('ZADD', KEYS[3], ARGV[1], v) end return v"
)


@dataclass
class Workload:
    """What every loop of one rep works through: ``n`` payloads, also cut in batches."""

    r: redis.Redis
    n: int
    batch: int
    payloads: list[bytes]
    batches: list[Sequence[bytes]]


@dataclass(frozen=True)
class Loop:
    """One timed loop. ``label`` and the row labels may use ``{b}`` for the batch size;
    ``floor_for`` (raw loops): the throughput rows comparing a belayq loop with this one,
    as (row label, belayq loop name), in report order."""

    name: str
    label: str
    setup: Callable[[Workload], Any]
    body: Callable[[Workload, Any], None]
    check: Callable[[Workload, Any], None]
    floor_for: tuple[tuple[str, str], ...] = ()

    @property
    def is_belayq(self) -> bool:
        return self.name.startswith("bq_")


# -- setups (outside the timing) ---------------------------------------------------------


def raw_empty(w: Workload) -> None:
    fresh(w.r)


def raw_filled(w: Workload) -> None:
    fresh(w.r)
    for b in w.batches:
        w.r.lpush(RAW_Q, *b)


def raw_filled_script(w: Workload) -> Script:
    raw_filled(w)
    script = w.r.register_script(RAW_CLAIM_LUA)
    w.r.script_load(RAW_CLAIM_LUA)
    return script


def bq_queue(filled: bool = False, **options: Any) -> Callable[[Workload], ReliableQueue]:
    """A fresh belayq queue with ``options``, empty or holding every payload."""

    def setup(w: Workload) -> ReliableQueue:
        fresh(w.r)
        q = queue(w.r, **options)
        if filled:
            for b in w.batches:
                q.publish_many(b)
        return q

    return setup


# -- checks (afterwards) -----------------------------------------------------------------


def raw_queued(w: Workload, _: None) -> None:
    need(w.r.llen(RAW_Q) == w.n, "raw list holds every message")


def raw_drained(w: Workload, _: Any) -> None:
    r = w.r
    need(r.llen(RAW_Q) == 0 and r.llen(RAW_P) == 0 and r.zcard(RAW_LEASE) == 0,
         "raw lists drained")


def bq_queued(w: Workload, q: ReliableQueue) -> None:
    need(q.stats()["ready"] == w.n, "belayq queue holds every message")


def bq_drained(w: Workload, q: ReliableQueue) -> None:
    check_drained(q)
    q.close(release=False)


# -- timed bodies ------------------------------------------------------------------------


def raw_lpush(w: Workload, _: None) -> None:
    r = w.r
    for p in w.payloads:
        r.lpush(RAW_Q, p)


def raw_lpush_pipe(w: Workload, _: None) -> None:
    r = w.r
    for b in w.batches:
        pipe = r.pipeline(transaction=False)
        for p in b:
            pipe.lpush(RAW_Q, p)
        pipe.execute()


def raw_blmove_lrem(w: Workload, _: None) -> None:
    r = w.r
    for _ in range(w.n):
        v = r.blmove(RAW_Q, RAW_P, 1, "RIGHT", "LEFT")
        need(v is not None, "raw blmove got nothing")
        r.lrem(RAW_P, 1, v)


def raw_pipe_floor(w: Workload, _: None) -> None:
    """LMOVE x batch pipelined, then LREM x batch pipelined."""
    r, n, batch = w.r, w.n, w.batch
    done = 0
    while done < n:
        pipe = r.pipeline(transaction=False)
        for _ in range(batch):
            pipe.lmove(RAW_Q, RAW_P, "RIGHT", "LEFT")
        got = [v for v in pipe.execute() if v is not None]
        need(bool(got), "raw pipelined lmove got nothing")
        pipe = r.pipeline(transaction=False)
        for v in got:
            pipe.lrem(RAW_P, -1, v)
        pipe.execute()
        done += len(got)


def raw_lua_floor(w: Workload, claim: Script) -> None:
    """Lua LMOVE+ZADD (a lease), then MULTI LREM ZREM EXEC."""
    r = w.r
    for _ in range(w.n):
        v = claim(keys=[RAW_Q, RAW_P, RAW_LEASE], args=[int(time.time() * 1000) + 30_000])
        need(v is not None, "raw lua claim got nothing")
        pipe = r.pipeline(transaction=True)
        pipe.lrem(RAW_P, 1, v)
        pipe.zrem(RAW_LEASE, v)
        pipe.execute()


def bq_publish(w: Workload, q: ReliableQueue) -> None:
    for p in w.payloads:
        q.publish(p)


def bq_publish_many(w: Workload, q: ReliableQueue) -> None:
    for b in w.batches:
        q.publish_many(b)


def bq_claim1_ack(w: Workload, q: ReliableQueue) -> None:
    n = w.n
    done = 0
    while done < n:
        got = q.claim(timeout=1.0, count=1)
        need(len(got) == 1, "claim(count=1) got nothing")
        need(q.ack(got[0]), "ack refused")
        done += 1


def bq_ack_and_claim(w: Workload, q: ReliableQueue) -> None:
    """Prefetch 1's steady state: the ack of one and the claim of the next, 1 round trip."""
    [held] = q.claim(timeout=1.0, count=1)
    for _ in range(w.n - 1):
        acked, got = q.ack_and_claim([held], 1)
        need(acked == [True] and len(got) == 1, "ack_and_claim")
        held = got[0]
    need(q.ack(held), "last ack refused")


def bq_claim_batch_ack_many(w: Workload, q: ReliableQueue) -> None:
    n, batch = w.n, w.batch
    done = 0
    while done < n:
        got = q.claim(timeout=1.0, count=batch)
        need(bool(got), "claim(count=batch) got nothing")
        need(all(q.ack_many(got)), "ack_many refused")
        done += len(got)


# -- the table ---------------------------------------------------------------------------

bq_filled = bq_queue(filled=True)

LOOPS: tuple[Loop, ...] = (
    Loop("raw_lpush", "raw LPUSH", raw_empty, raw_lpush, raw_queued,
         floor_for=(("publish, one by one", "bq_publish"),)),
    Loop("bq_publish", "belayq publish()", bq_queue(), bq_publish, bq_queued),
    Loop("raw_lpush_pipe", "raw LPUSH pipelined {b}", raw_empty, raw_lpush_pipe, raw_queued,
         floor_for=(("publish, batches of {b}", "bq_publish_many"),)),
    Loop("bq_publish_many", "belayq publish_many({b})", bq_queue(), bq_publish_many, bq_queued),
    Loop("raw_blmove_lrem", "raw BLMOVE + LREM", raw_filled, raw_blmove_lrem, raw_drained,
         floor_for=(
             ("claim+ack, count=1", "bq_claim1_ack"),
             ("claim+ack, count=1, as scripts", "bq_claim1_ack_scripts"),
             ("ack_and_claim, count=1 (1 round trip)", "bq_ack_and_claim"),
             ("claim+ack, count={b} (vs unbatched floor)", "bq_claim100_ack_many"),
         )),
    # claim(count=1) + ack as the library's functions (the default on 7.0+) and as scripts
    # (lua_functions=False, what 6.2, clusters and restricted ACL users run)
    Loop("bq_claim1_ack", "belayq claim(count=1) + ack", bq_filled, bq_claim1_ack, bq_drained),
    Loop("bq_claim1_ack_scripts", "belayq claim(count=1) + ack, lua_functions=False",
         bq_queue(filled=True, lua_functions=False), bq_claim1_ack, bq_drained),
    Loop("bq_ack_and_claim", "belayq ack_and_claim(count=1)", bq_filled, bq_ack_and_claim,
         bq_drained),
    Loop("bq_claim100_ack_many", "belayq claim(count={b}) + ack_many", bq_filled,
         bq_claim_batch_ack_many, bq_drained),
    Loop("raw_pipe_floor", "raw LMOVE x{b} pipe + LREM x{b} pipe", raw_filled, raw_pipe_floor,
         raw_drained, floor_for=(("claim+ack, count={b} (vs batched floor)",
                                  "bq_claim100_ack_many"),)),
    Loop("raw_lua_floor", "raw Lua(LMOVE+ZADD) + MULTI(LREM,ZREM)", raw_filled_script,
         raw_lua_floor, raw_drained,
         floor_for=(("claim+ack, count=1 (vs Lua lease floor)", "bq_claim1_ack"),)),
)

# The report's views of the table: the per-loop rows (belayq loops first), and the
# throughput rows as (row label, belayq loop, raw loop).
LOOP_LABELS = {loop.name: loop.label for loop in sorted(LOOPS, key=lambda x: not x.is_belayq)}
THROUGHPUT_ROWS = [(label, bq, loop.name) for loop in LOOPS for label, bq in loop.floor_for]
if not {bq for _, bq, _ in THROUGHPUT_ROWS} <= set(LOOP_LABELS):
    raise RuntimeError("a raw loop is the floor of an unknown belayq loop")


def run_throughput(r: redis.Redis, n: int, size: int, batch: int) -> dict[str, Sample]:
    """One rep of every loop, belayq and raw interleaved. Returns samples by loop name."""
    payloads = make_payloads(n, size, b"m")
    w = Workload(r, n, batch, payloads, chunks(payloads, batch))
    out: dict[str, Sample] = {}
    for loop in LOOPS:
        subject = loop.setup(w)
        out[loop.name] = measure(r, n, functools.partial(loop.body, w, subject))
        loop.check(w, subject)
    fresh(r)
    return out
