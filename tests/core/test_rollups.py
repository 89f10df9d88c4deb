"""The per-minute history of a queue's counters (belayq.rollups): one snapshot per minute
for a whole fleet, nothing written by an idle queue, a day kept, counts per minute with
gaps spread, shards summed, and the lease keeper writing them."""

from __future__ import annotations

from typing import Any

import pytest

from belayq import ShardedQueue, rollups
from belayq import holding as holding_module
from belayq.rollups import (
    COUNTERS,
    KEEP_MINUTES,
    MINUTE_MS,
    PER_MINUTE,
    SNAPSHOT,
    history,
    record_minute,
)
from tests.support import wait_for


def minute_now(r: Any) -> int:
    seconds, micros = r.time()
    return (int(seconds) * 1000 + int(micros) // 1000) // MINUTE_MS


def test_one_snapshot_per_minute_whoever_writes(r: Any, make_queue: Any) -> None:
    q = make_queue(r)
    other = make_queue(r)  # another process's view of the same queue
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    q.ack(d)
    before = minute_now(r)
    seen = record_minute(q, None)
    assert seen is not None and seen[COUNTERS.index("acked")] == 1
    snaps = r.hgetall(q.keys.rollups)
    [(minute, values)] = snaps.items()
    assert before <= int(minute) <= minute_now(r)
    assert values.split() == [str(v).encode() for v in seen]
    q.publish(b"b")
    record_minute(other, None)  # the same minute: the first snapshot stays
    assert r.hgetall(q.keys.rollups) == snaps
    assert 0 < r.pttl(q.keys.rollups) <= (KEEP_MINUTES + rollups.TRIM_SLACK) * MINUTE_MS


def test_an_idle_queue_writes_nothing(r: Any, make_queue: Any) -> None:
    q = make_queue(r)
    assert record_minute(q, None) == (0,) * len(SNAPSHOT)
    assert r.exists(q.keys.rollups, q.keys.stats) == 0  # no key created
    q.publish(b"a")
    seen = record_minute(q, None)
    r.delete(q.keys.rollups)
    assert record_minute(q, seen) == seen  # unchanged since this process last looked
    assert r.exists(q.keys.rollups) == 0


def test_counts_per_minute_spread_over_gaps_and_summed_over_shards(r: Any) -> None:
    q = ShardedQueue(r, "rolled", shards=2, keeper=False)
    try:
        a, b = q.shards
        base = 29_000_000
        acked = COUNTERS.index("acked")

        def snap(part: Any, minute: int, n: int) -> None:
            values = [0] * len(COUNTERS)
            values[acked] = n
            r.hset(part.keys.rollups, str(minute), " ".join(map(str, values)))

        snap(a, base, 10)
        snap(a, base + 1, 70)   # 60 in minute +1
        snap(a, base + 4, 100)  # 30 over minutes +2..+4: 10 each
        snap(b, base + 3, 5)
        snap(b, base + 4, 25)   # 20 in minute +4
        rows = {row["t"] // MINUTE_MS - base: row["acked"] for row in history(q)}
        assert rows == {1: 60, 2: 10, 3: 10, 4: 30}
        assert {row["t"] // MINUTE_MS - base: row["acked"] for row in history(q, 2)} == {
            3: 10, 4: 30}
        assert all(set(row) == {"t", *PER_MINUTE} for row in history(q))
    finally:
        q.close(release=False)


def test_a_day_is_kept(r: Any, make_queue: Any) -> None:
    q = make_queue(r)
    now = minute_now(r)
    snap = "1 0 0 0 0 0 0 0"
    kept = {str(now - i): snap for i in range(1, KEEP_MINUTES)}  # the day before this minute
    old = {str(now - KEEP_MINUTES - i): snap for i in range(rollups.TRIM_SLACK + 5)}
    r.hset(q.keys.rollups, mapping={**kept, **old})
    q.publish(b"x")
    record_minute(q, None)
    left = sorted(int(f) for f in r.hkeys(q.keys.rollups))
    assert left == [*sorted(map(int, kept)), now]


def test_the_lease_keeper_writes_them(r: Any, make_queue: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holding_module, "ROLLUP_EVERY_S", 0.0)
    q = make_queue(r, keeper=True, lease_ms=2000)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    wait_for(lambda: r.hlen(q.keys.rollups) == 1, 10, "the keeper's snapshot")
    q.ack(d)
