"""Purge keeps or removes delayed messages on purpose, and says how many of each it
deleted; promote_delayed makes every delayed message ready now, in batches. The kombu
transport's purge (``celery purge``) deletes ready messages only, as on a stock fleet, where
the workers hold countdown/ETA tasks in memory."""

from __future__ import annotations

import uuid
from typing import Any

import kombu
import pytest
import redis

import belayq_kombu  # noqa: F401  (registers belayq://)
from belayq import ConfigError, Purged, ReliableQueue
from belayq.keys import kombu_layout


def sizes(q: ReliableQueue) -> tuple[int, int, int]:
    s = q.stats()
    return s["ready"], s["delayed"], s["in_flight"]


@pytest.fixture
def q(r: redis.Redis, make_queue: Any) -> ReliableQueue:
    q = make_queue(r)
    q.publish_many([b"r1", b"r2", b"r3", b"held"])
    q.publish(b"d1", delay_ms=60_000)
    q.publish(b"d2", delay_ms=30_000, priority=3)
    return q


def test_purge_without_delayed_deletes_the_ready_messages_only(q: ReliableQueue) -> None:
    [held] = q.claim(timeout=0)
    got = q.purge(delayed=False)
    assert isinstance(got, Purged) and isinstance(got, int)
    assert (got.ready, got.delayed, got) == (3, 0, 3)
    assert sizes(q) == (0, 2, 1) and q.ack(held)


def test_purge_with_delayed_deletes_both_and_counts_them_apart(q: ReliableQueue) -> None:
    got = q.purge()
    assert (got.ready, got.delayed, int(got)) == (4, 2, 6) and got == 6
    assert repr(got) == "Purged(ready=4, delayed=2)" and f"{got}" == "6"
    assert sizes(q) == (0, 0, 0)
    assert not q.client.exists(q.keys.meta, q.keys.payloads)


def test_purge_goes_in_batches(q: ReliableQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("belayq.admin.PURGE_BATCH", 2)
    seen: list[int] = []
    got = q.purge(seen.append)
    assert (got.ready, got.delayed) == (4, 2) and seen == [2, 4]
    with pytest.raises(ConfigError, match="delayed"):
        q.purge(delayed="no")  # type: ignore[arg-type]


def test_promote_delayed_makes_every_delayed_message_ready_now(q: ReliableQueue) -> None:
    assert q.promote_delayed(batch=1) == 2
    assert sizes(q) == (6, 0, 0)
    got = q.claim(timeout=0, count=10)
    # each at the back of its level: d1 behind the others of level 1, d2 in level 4
    assert [d.payload for d in got] == [b"r1", b"r2", b"r3", b"held", b"d1", b"d2"]
    assert q.promote_delayed() == 0
    with pytest.raises(ConfigError, match="batch"):
        q.promote_delayed(batch=0)


def test_promote_delayed_on_an_inline_queue(r: redis.Redis, make_queue: Any) -> None:
    q = make_queue(r, **kombu_layout(f"kq-{uuid.uuid4().hex[:8]}"))
    q.publish(b'{"body": 1}', delay_ms=60_000)
    q.publish(b'{"body": 1}', delay_ms=60_000)  # identical: two messages
    assert q.promote_delayed() == 2
    assert r.lrange(q.keys.ready, 0, -1) == [b'{"body": 1}', b'{"body": 1}']
    assert not r.exists(q.keys.meta, q.keys.payloads)


def test_the_kombu_purge_keeps_delayed_messages(r: redis.Redis, make_queue: Any) -> None:
    name = f"kq-{uuid.uuid4().hex[:8]}"
    core = make_queue(r, **kombu_layout(name))
    core.publish(b'{"eta": 1}', delay_ms=600_000)
    kq = kombu.Queue(name, routing_key=name)
    port = r.connection_pool.connection_kwargs["port"]
    with kombu.Connection(f"belayq://127.0.0.1:{port}/0") as conn:
        producer = conn.Producer()
        for i in range(3):
            producer.publish({"n": i}, routing_key=name, declare=[kq])
        assert kq(conn.default_channel).purge() == 3
    assert sizes(core) == (0, 1, 0)
