"""The metrics consumers observe (queue wait, run time, failed runs) and the consumers
holding leases, read by the exporter's collector from a real redis-server."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.holders import consumer_member
from belayq.keys import kombu_layout
from belayq.metrics import QueueCollector
from tests.conftest import flushed_client

parser = pytest.importorskip("prometheus_client.parser")


@pytest.fixture
def client(private_redis: RedisServer) -> Iterator[redis.Redis]:
    with flushed_client(private_redis) as c:
        yield c


def scrape(*queues: ReliableQueue) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(QueueCollector(lambda: list(queues)))  # type: ignore[arg-type]
    out = {}
    for family in parser.text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_wait_and_run_histograms_count_claims_and_acks(client: redis.Redis) -> None:
    q = ReliableQueue(client, "orders", keeper=False)
    q.publish_many([b"a", b"b", b"c"])
    time.sleep(0.3)  # every message waits at least this long
    held = q.claim(timeout=0, count=2)
    time.sleep(0.2)  # and runs at least this long
    assert q.ack_many(held) == [True, True]
    q.flush_observations()
    m = scrape(q)
    lab = (("kind", "belayq"), ("queue", "orders"))
    assert m[("belayq_queue_wait_seconds_count", lab)] == 2  # the third still waits
    assert 0.6 <= m[("belayq_queue_wait_seconds_sum", lab)] < 10
    assert m[("belayq_queue_wait_seconds_bucket", (*lab[:1], ("le", "0.25"), lab[1]))] == 0
    assert m[("belayq_queue_wait_seconds_bucket", (*lab[:1], ("le", "+Inf"), lab[1]))] == 2
    assert m[("belayq_run_seconds_count", lab)] == 2
    assert 0.4 <= m[("belayq_run_seconds_sum", lab)] < 10
    assert m[("belayq_run_seconds_bucket", (*lab[:1], ("le", "0.1"), lab[1]))] == 0
    assert m[("belayq_acked_total", lab)] == 2


def test_observations_are_written_by_the_first_ack_then_once_a_second(
    client: redis.Redis,
) -> None:
    q = ReliableQueue(client, "orders", keeper=False)
    q.publish_many([b"a", b"b"])
    [d] = q.claim(timeout=0)
    q.ack(d)  # the first write of this object goes at once
    [e] = q.claim(timeout=0)
    q.ack(e)  # within the second: kept in memory
    lab = (("kind", "belayq"), ("queue", "orders"))
    assert scrape(q)[("belayq_run_seconds_count", lab)] == 1
    q.close()  # ... and written at close
    assert scrape(q)[("belayq_run_seconds_count", lab)] == 2


def test_failed_runs_are_counted_beside_the_acks(client: redis.Redis) -> None:
    q = ReliableQueue(client, "tasks", keeper=False)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    q.count_failed()  # what the Celery adapter does on task_failure
    q.ack(d)  # Celery acks a failed task
    m = scrape(q)
    lab = (("kind", "belayq"), ("queue", "tasks"))
    assert (m[("belayq_acked_total", lab)], m[("belayq_failed_total", lab)]) == (1, 1)


def _hold_in_child(port: int, out: Any) -> None:
    child = ReliableQueue(redis.Redis(port=port), "jobs", keeper=False)
    [d] = child.claim(timeout=0)
    child.heartbeat()
    out.put((d.id, consumer_member()))


def test_consumers_holding_leases(client: redis.Redis) -> None:
    """A consumer is a process: its queue objects count once; it is counted while it holds
    leases (registered at its claim and at each beat), out at the first beat at which none
    of its objects holds any, and not counted once it stopped beating for a lease."""
    q1 = ReliableQueue(client, "jobs", keeper=False)
    q2 = ReliableQueue(client, "jobs", keeper=False)  # another object of this process
    idle = ReliableQueue(client, "jobs", keeper=False)
    q1.publish_many([b"a", b"b", b"c"])
    [d1] = q1.claim(timeout=0)
    [d2] = q2.claim(timeout=0)
    for q in (q1, q2, idle):
        q.heartbeat()  # what the lease keeper does every beat
    lab = (("kind", "belayq"), ("queue", "jobs"))
    assert scrape(q1)[("belayq_consumers", lab)] == 1
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_hold_in_child,
                    args=(client.connection_pool.connection_kwargs["port"], out))
    p.start()
    _, child = out.get(timeout=30)
    p.join(30)
    assert scrape(q1)[("belayq_consumers", lab)] == 2
    q1.ack(d1)
    q1.heartbeat()  # q1 holds nothing, q2 still does: the process stays
    assert scrape(q1)[("belayq_consumers", lab)] == 2
    assert consumer_member() in {m.decode() for m in client.zrange(q1.keys.consumers, 0, -1)}
    q2.close(release=False)  # left, its claim to its lease: this process holds none now
    assert scrape(q1)[("belayq_consumers", lab)] == 1
    assert client.zrange(q1.keys.consumers, 0, -1) == [child.encode()]
    seconds, micros = client.time()
    stopped = int(seconds) * 1000 + int(micros) // 1000 - 2 * q1.config.lease_ms
    client.zadd(q1.keys.consumers, {child: stopped}, xx=True)  # it stopped beating
    assert scrape(q1)[("belayq_consumers", lab)] == 0
    assert d2.deliveries == 1
    q1.publish(b"d")
    [d3] = q1.claim(timeout=0)  # holding again: registered again at the claim
    assert scrape(q1)[("belayq_consumers", lab)] == 1
    q1.ack(d3)


def test_oldest_ready_age_of_a_kombu_list(client: redis.Redis) -> None:
    q = ReliableQueue(client, "celery", keeper=False, **kombu_layout("celery"))
    stamped = (b'{"body": "", "headers": {}, "properties": {"x-belayq-published-ms": %d}}'
               % (int(time.time() * 1000) - 30_000))
    client.lpush(q.keys.ready, stamped)  # what belayq:// publishes
    lab = (("kind", "kombu"), ("queue", "celery"))
    assert 29 < scrape(q)[("belayq_oldest_ready_age_seconds", lab)] < 60
    client.delete(q.keys.ready)
    client.lpush(q.keys.ready, b'{"body": "", "headers": {}, "properties": {}}')  # a stock one
    assert ("belayq_oldest_ready_age_seconds", lab) not in scrape(q)
