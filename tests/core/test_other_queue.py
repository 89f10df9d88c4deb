"""A claim is settled by the queue it was claimed from: any settle of a delivery whose
queue (or shard) is another raises ConfigError before any command, and the claim stays
held by its own queue. And the history tells when belayq's own messages were published."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from belayq import ConfigError, Delivery, ReliableQueue

SETTLES: dict[str, Callable[[ReliableQueue, Delivery], Any]] = {
    "ack": lambda q, d: q.ack(d),
    "ack_many": lambda q, d: q.ack_many([d]),
    "ack_and_claim": lambda q, d: q.ack_and_claim([d], 1),
    "nack": lambda q, d: q.nack(d),
    "dead_letter": lambda q, d: q.dead_letter(d, "bad"),
    "release": lambda q, d: q.release([d]),
    "defer": lambda q, d: q.defer([(d, 1000)]),
    "extend": lambda q, d: q.extend([d]),
    "start": lambda q, d: q.start([d], now=True),
}


class Unreachable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a command was sent ({name}) for another queue's claim")


@pytest.mark.parametrize("settle", list(SETTLES.values()), ids=list(SETTLES))
def test_settling_another_queue_s_claim_raises_before_any_command(
    r: redis.Redis, make_queue: Any, qname: str, settle: Callable[[ReliableQueue, Delivery], Any]
) -> None:
    a = make_queue(r, qname + "-a", claim_starts=False)
    b = make_queue(r, qname + "-b", claim_starts=False)
    a.publish(b"x")
    [d] = a.claim(timeout=0)
    b.client = b._scripts.client = Unreachable()
    with pytest.raises(ConfigError, match=f"claimed from queue '{qname}-a', not queue '{qname}-b'"):
        settle(b, d)
    assert a.held == [d] and a.ack(d) is True


def test_a_shard_s_claim_settled_on_another_shard_is_refused(
    r: redis.Redis, make_queue: Any, qname: str
) -> None:
    a = make_queue(r, qname + "-s1")
    b = make_queue(r, qname + "-s2")
    a.sharded_as = b.sharded_as = qname
    a.publish(b"x")
    [d] = a.claim(timeout=0)
    assert (d.queue, d.shard) == (qname, qname + "-s1")
    with pytest.raises(ConfigError, match="shard"):
        b.ack(d)
    assert a.ack(d) is True


def test_history_tells_when_belayq_s_own_messages_were_published(
    r: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(r, history_max=10)
    before = int(time.time() * 1000)
    q.publish(b"ours")
    r.lpush(q.keys.ready, b"foreign")  # an id of another form (and no payload: dead)
    [d] = q.claim(timeout=0, count=2)
    assert q.ack(d) is True
    [done] = q.history("done")
    assert before - 5 <= done.published_ms <= int(time.time() * 1000)
    [failed] = q.history("failed")
    assert (failed.id, failed.published_ms) == ("foreign", 0)  # its time is unknown
