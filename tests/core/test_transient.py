"""A transient queue (``transient=True``: a reply queue named anew for each request) keeps
no counters, no reply memo and no dedup memo, so once its messages are settled it leaves
no key behind."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from belayq import ConfigError, ReliableQueue
from belayq.keys import kombu_layout


def keys_left(q: ReliableQueue) -> list[str]:
    return [k for k in q.keys.all_keys() if q.client.exists(k)]


@pytest.mark.parametrize("functions", [None, False], ids=["functions", "scripts"])
@pytest.mark.parametrize("inline", [False, True], ids=["ids", "inline"])
def test_a_transient_queue_leaves_no_key_once_its_messages_are_settled(
    r: redis.Redis, make_queue: Any, qname: str, inline: bool, functions: bool | None
) -> None:
    layout = kombu_layout(f"{qname}.reply.celery.pidbox") if inline else {}
    q = make_queue(r, transient=True, lease_ms=1_000, starvation_floor=0.25,
                   lua_functions=functions, **layout)
    q.publish_many([b"a", b"b", b"c", b"d"])
    q.publish(b"later", delay_ms=1)
    a, b, c, d = q.claim(timeout=0, count=4)
    assert q.nack(a, delay_ms=0) == "ready" and q.release([b]) == 1
    assert q.defer([(c, 1)]) == 1 and q.extend([d]) == [True]
    assert q.ack(d)
    q._scripts.skew_ms = 10
    got = q.claim(timeout=0, count=10)
    assert sorted(x.payload for x in got) == [b"a", b"b", b"c", b"later"]
    assert q.ack_many(got) == [True] * 4
    q.sweep()
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["delayed"], s["dead"]) == (0, 0, 0, 0)
    assert "published" not in s and "acked" not in s
    assert keys_left(q) == []


def test_a_transient_queue_refuses_dedup_ids_and_a_history(
    r: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(r, transient=True)
    with pytest.raises(ConfigError, match="dedup"):
        q.publish(b"x", dedup_id="once")
    with pytest.raises(ConfigError, match="history"):
        ReliableQueue(r, f"t-{uuid.uuid4().hex[:8]}", transient=True, history_max=5)
    with pytest.raises(ConfigError, match="transient"):
        ReliableQueue(r, f"t-{uuid.uuid4().hex[:8]}", transient="yes")
    assert keys_left(q) == []
