"""Who holds a claim: a consumer registers its host and pid once per queue (not per claim),
the tokens of its claims carry its tag, and ``in_flight``/``holders`` name the holder of
each lease; a forked child is a consumer of its own; the records stay bounded; a consumer
that cannot register still claims."""

from __future__ import annotations

import multiprocessing
import os
import socket
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.constants import CONSUMERS_KEPT
from belayq.sharded import ShardedQueue

HERE = f"{socket.gethostname()}:{os.getpid()}"


def test_the_lease_names_this_host_and_pid(q: ReliableQueue) -> None:
    q.publish_many([b"a", b"b", b"c"])
    got = q.claim(timeout=0, count=2)
    leases = q.in_flight()
    assert {lease.id for lease in leases} == {d.id for d in got}
    assert {(lease.host, lease.pid) for lease in leases} == {(socket.gethostname(), os.getpid())}
    assert all(lease.deadline_ms > 0 and lease.deliveries == 1 for lease in leases)
    assert q.holders() == {HERE: 2}
    [record] = q.consumers().values()
    assert (record.host, record.pid) == (socket.gethostname(), os.getpid())
    q.ack_many(got)
    assert q.in_flight() == [] and q.holders() == {}


def test_a_consumer_registers_once_not_per_claim(q: ReliableQueue) -> None:
    calls: list[str] = []
    run = q._scripts.run

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return run(name, *args, **kwargs)

    q._scripts.run = counted  # type: ignore[method-assign]
    for i in range(30):
        q.publish(b"%d" % i)
        [d] = q.claim(timeout=0)
        q.ack(d)
    assert calls.count("register") == 1 and calls.count("claim") == 30


def _claim_in_child(port: int, name: str, out: Any) -> None:
    client = redis.Redis(port=port)
    child = ReliableQueue(client, name, keeper=False, lease_ms=60_000)
    [d] = child.claim(timeout=0)
    out.put((d.id, os.getpid()))


def test_a_forked_child_holds_under_its_own_pid(q: ReliableQueue) -> None:
    q.publish_many([b"parent", b"child"])
    [mine] = q.claim(timeout=0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    port = q.client.connection_pool.connection_kwargs["port"]
    p = ctx.Process(target=_claim_in_child, args=(port, q.name, out))
    p.start()
    child_id, child_pid = out.get(timeout=30)
    p.join(30)
    by_id = {lease.id: lease.pid for lease in q.in_flight()}
    assert by_id == {mine.id: os.getpid(), child_id: child_pid} and child_pid != os.getpid()
    assert q.holders() == {HERE: 1, f"{socket.gethostname()}:{child_pid}": 1}


def test_the_records_stay_bounded_newest_kept(q: ReliableQueue) -> None:
    for i in range(5):
        q._scripts.run("register", f"{i:08x}", "host-x", 100 + i, 3)
    kept = q.consumers()
    assert sorted(kept) == ["00000002", "00000003", "00000004"]
    assert CONSUMERS_KEPT >= 100  # a real fleet's records all fit


def test_a_consumer_that_cannot_register_still_claims(q: ReliableQueue) -> None:
    run = q._scripts.run

    def refused(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "register":
            raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")
        return run(name, *args, **kwargs)

    q._scripts.run = refused  # type: ignore[method-assign]
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    assert q.holders() == {"": 1}  # unknown holder, yet claimed and settled as usual
    assert q.ack(d)


@pytest.mark.parametrize("shards", [3])
def test_a_sharded_queue_sums_its_holders(q: ReliableQueue, shards: int) -> None:
    sq = ShardedQueue(q.client, f"h-{q.name}", shards=shards, keeper=False,
                      lua_functions=q.config.lua_functions)
    try:
        sq.publish_many([b"%d" % i for i in range(6)])
        got = sq.claim(timeout=0, count=6)
        assert len(got) == 6
        assert sq.holders() == {HERE: 6}
        assert len(sq.in_flight(limit=4)) == 4
    finally:
        sq.close(release=False)
