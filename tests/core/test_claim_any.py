"""belayq.claim_any.claim_any: priority order, blocking on several queues at once without
polling, nothing lost when more than one queue answers, and its fallbacks.

Idle pickup latencies are printed (``pytest -s``); the assertions are generous because
other work shares this machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.claim_any import FALLBACK_SLICE_S, claim_any
from belayq.embedded import RedisServer
from tests.conftest import flushed_client


@pytest.fixture
def conn(private_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of a server of its own (the tests count its blocked clients), emptied."""
    with flushed_client(private_redis) as client:
        yield client


def rq_like(client: Any, name: str, **options: Any) -> ReliableQueue:
    """A core queue over an RQ-style list (ids pushed right, claimed from the left)."""
    options.setdefault("keeper", False)
    return ReliableQueue(
        client, name, ready_key=f"rq:queue:{name}", payload_in_list=True, ready_head="left",
        **options,
    )


def blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def wait_blocked(client: redis.Redis, n: int) -> None:
    deadline = time.monotonic() + 10
    while blocked_clients(client) < n:
        assert time.monotonic() < deadline, "claim_any did not block"
        time.sleep(0.005)


def test_priority_order_and_count_across_queues(conn: redis.Redis) -> None:
    qs = [rq_like(conn, n) for n in ("hi", "mid", "lo")]
    conn.rpush("rq:queue:lo", "l1", "l2")
    conn.rpush("rq:queue:hi", "h1")
    got = claim_any(qs, 0, count=2)
    assert [(d.queue, d.id) for d in got] == [("hi", "h1"), ("lo", "l1")]
    assert claim_any(qs, 0) and claim_any(qs, 0) == []
    t0 = time.monotonic()
    assert claim_any(qs, 0.3) == []
    assert 0.25 < time.monotonic() - t0 < 3


def test_blocks_on_all_queues_and_unblocks_the_others(conn: redis.Redis) -> None:
    qs = [rq_like(conn, n) for n in ("a", "b", "c")]
    t, out = in_thread(lambda: claim_any(qs, 10))
    wait_blocked(conn, 3)
    conn.rpush("rq:queue:b", "job-b")
    t.join(10)
    assert [d.id for d in out[0]] == ["job-b"]
    assert blocked_clients(conn) == 0  # the other two were released
    assert [q.stats()["in_flight"] for q in qs] == [0, 1, 0]


def test_two_queues_answering_at_once_keeps_the_higher_and_returns_the_other(
    conn: redis.Redis,
) -> None:
    qs = [rq_like(conn, n) for n in ("a", "b")]
    t, out = in_thread(lambda: claim_any(qs, 10, count=1))
    wait_blocked(conn, 2)
    with conn.pipeline(transaction=True) as pipe:  # both blocked claims are served
        pipe.rpush("rq:queue:b", "job-b").rpush("rq:queue:a", "job-a").rpush("rq:queue:b", "b2")
        pipe.execute()
    t.join(10)
    assert [d.id for d in out[0]] == ["job-a"]
    # job-b was moved by its BLMOVE too; it is back at the head of b, uncounted.
    assert conn.lrange("rq:queue:b", 0, -1) == [b"job-b", b"b2"]
    sb = qs[1].stats()
    assert (sb["in_flight"], sb["leased"], sb.get("released", 0)) == (0, 0, 1)
    [d] = qs[1].try_claim(1)[0]
    assert (d.id, d.deliveries) == ("job-b", 1)


def test_without_client_unblock_permission_the_connections_are_closed(
    conn: redis.Redis, private_redis: Any
) -> None:
    conn.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all",
                         "-client|unblock")
    limited = redis.Redis(port=private_redis.port, username="limited", password="pw")
    qs = [rq_like(limited, n) for n in ("a", "b", "c")]
    t, out = in_thread(lambda: claim_any(qs, 10))
    wait_blocked(conn, 3)
    conn.rpush("rq:queue:c", "job-c")
    t.join(10)
    assert [d.id for d in out[0]] == ["job-c"]
    deadline = time.monotonic() + 5
    while blocked_clients(conn) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert blocked_clients(conn) == 0
    conn.execute_command("ACL", "DELUSER", "limited")


def test_an_entry_moved_by_a_claimer_that_died_is_swept_back(conn: redis.Redis) -> None:
    """A claimer killed between its BLMOVE and the lease leaves the entry in processing:
    the sweep adopts it and hands it back after one lease."""
    q = rq_like(conn, "a", lease_ms=200)
    conn.rpush("rq:queue:a", "job")
    conn.execute_command(*q.blmove_command(1))  # ...and the claimer dies here
    assert claim_any([q], 0) == []
    q.sweep()
    time.sleep(0.25)
    q.sweep()
    assert [d.id for d in claim_any([q], 0)] == ["job"]


def _pickup_ms(client: redis.Redis, qs: list[ReliableQueue], target: str, n: int) -> list[float]:
    lat = []
    for i in range(n):
        ready = threading.Event()

        def claim(ready: threading.Event = ready) -> tuple[Any, float]:
            ready.set()
            return claim_any(qs, 10), time.perf_counter()

        t, out = in_thread(claim)
        ready.wait()
        if isinstance(client, redis.Redis) and type(client).__module__.startswith("redis"):
            wait_blocked(client, len(qs) if len(qs) > 1 else 1)
        else:
            time.sleep(0.01)
        t0 = time.perf_counter()
        client.rpush(f"rq:queue:{target}", f"m{i}")
        t.join(10)
        got, t1 = out[0]
        assert [d.id for d in got] == [f"m{i}"]
        qs[[q.name for q in qs].index(target)].ack(got[0])
        lat.append((t1 - t0) * 1000)
    return sorted(lat)


@pytest.mark.parametrize("nqueues", [1, 3])
def test_idle_pickup_latency(conn: redis.Redis, nqueues: int) -> None:
    qs = [rq_like(conn, f"q{i}") for i in range(nqueues)]
    lat = _pickup_ms(conn, qs, f"q{nqueues - 1}", 200)
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    print(f"\nidle pickup, {nqueues} queue(s), job on the lowest: p50 {p50:.2f} ms, "
          f"p99 {p99:.2f} ms (n=200)")
    assert p50 < 100 and p99 < 1000


def test_fakeredis_fallback_waits_without_spinning() -> None:
    import fakeredis

    client = fakeredis.FakeRedis()
    qs = [rq_like(client, n) for n in ("a", "b")]
    t0 = time.monotonic()
    assert claim_any(qs, 0.5) == []
    assert 0.45 < time.monotonic() - t0 < 3
    lat = _pickup_ms(client, qs, "b", 20)
    print(f"\nfakeredis fallback pickup, 2 queues: p50 {lat[10]:.1f} ms, max {lat[-1]:.1f} ms "
          f"(slice {FALLBACK_SLICE_S * 1000:.0f} ms)")
    assert lat[-1] < 2000


def test_cluster_blocks_on_each_queues_node(cluster_servers: Any) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    client = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in cluster_servers.startup_nodes]
    )
    names = [f"c{i}-{time.monotonic_ns()}" for i in range(3)]
    qs = [rq_like(client, n) for n in names]
    client.rpush(f"rq:queue:{names[2]}", "x")
    client.rpush(f"rq:queue:{names[0]}", "y")
    assert [d.id for d in claim_any(qs, 0, count=2)] == ["y", "x"]
    lat = _pickup_ms(client, qs, names[2], 20)
    lat0 = _pickup_ms(client, qs, names[0], 20)
    print(f"\ncluster pickup, 3 queues on 3 masters: lowest p50 {lat[10]:.1f} ms max {lat[-1]:.1f} "
          f"ms; highest p50 {lat0[10]:.1f} ms max {lat0[-1]:.1f} ms")
    assert lat[-1] < 2000
    client.close()
