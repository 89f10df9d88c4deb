"""The failed runs an adapter records (belayq.failures): newest first, a job's new failure
replacing its old one, the newest KEPT kept, long texts cut, expiring a week after the last
failure, on a sharded queue in its first shard, and gone with the queue when it is dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from belayq import ShardedQueue, failures


def test_newest_first_replaced_and_deleted(r: Any, make_queue: Any) -> None:
    q = make_queue(r)
    failures.record(q, "a", 1_000, {"task": "t.a", "reason": "ValueError: x"})
    failures.record(q, "b", 2_000, {"task": "t.b"})
    assert [x["id"] for x in failures.newest(q, 10)] == ["b", "a"]
    failures.record(q, "a", 3_000, {"task": "t.a", "reason": "KeyError: y"})
    assert failures.count(q) == 2
    assert [x["id"] for x in failures.newest(q, 10)] == ["a", "b"]
    assert failures.get(q, "a") == {"task": "t.a", "reason": "KeyError: y", "id": "a",
                                    "failed_at_ms": 3_000}
    assert failures.get(q, "nope") is None
    assert failures.discard(q, ["a", "nope"]) == 1
    assert failures.discard(q, []) == 0
    assert [x["id"] for x in failures.newest(q, 10)] == ["b"]
    assert 0 < r.pttl(q.keys.failures) <= failures.KEEP_MS
    assert 0 < r.pttl(q.keys.failures_at) <= failures.KEEP_MS


def test_the_newest_kept_and_long_texts_cut(r: Any, make_queue: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failures, "KEPT", 3)
    q = make_queue(r)
    for i in range(5):
        failures.record(q, f"j{i}", i, {"exc_info": "x" * (failures.MAX_TEXT + 10)})
    assert failures.count(q) == 3
    assert sorted(r.hkeys(q.keys.failures)) == [b"j2", b"j3", b"j4"]
    text = failures.get(q, "j4")["exc_info"]
    assert text.startswith("x" * failures.MAX_TEXT) and text.endswith("(10 more characters)")


def test_a_sharded_queue_keeps_them_in_its_first_shard(r: Any, qname: str) -> None:
    q = ShardedQueue(r, qname, shards=3, keeper=False)
    try:
        failures.record(q, "a", 1, {"task": "t"})
        assert json.loads(r.hget(q.shards[0].keys.failures, "a"))["task"] == "t"
        assert failures.count(q) == 1
    finally:
        q.close(release=False)


def test_dropped_with_the_queue(r: Any, make_queue: Any) -> None:
    q = make_queue(r)
    q.publish(b"x")
    failures.record(q, "a", 1, {})
    assert q.drop()
    assert not r.exists(q.keys.failures, q.keys.failures_at)
