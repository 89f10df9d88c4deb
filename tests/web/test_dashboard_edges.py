"""The dashboard acts on a queue with the queue's own recorded limits, never with defaults
of its own: its "Run reclaim sweep" keeps a message that has runs left, keeps the dead
letters the queue's cap allows, and hands an RQ job that ran out of runs back to RQ's
failed-job registry (its final delivery) instead of the core's dead-letter set. It refuses
to sweep a queue nobody recorded, and to act on a key that is no queue."""

from __future__ import annotations

import time
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.keys import rq_layout
from tests.web.test_dashboard import call

web = __import__("pytest").importorskip("belayq.web")

LEASE_MS = 150


def run_and_lose(q: ReliableQueue, times: int) -> None:
    """Claim the queue's one message ``times`` times and let each lease run out (the worker
    died), its own sweep putting it back: ``times`` lost runs."""
    for _ in range(times):
        [d] = q.claim(timeout=1)
        assert d.attempts >= 1
        time.sleep(LEASE_MS / 1000 + 0.05)
        q.sweep()


def test_the_sweep_applies_the_queues_own_max_deliveries(client: redis.Redis, served: Any) -> None:
    worker = ReliableQueue(client, "long-jobs", keeper=False, lease_ms=LEASE_MS,
                           max_deliveries=20)
    worker.publish(b"job")
    run_and_lose(worker, 6)
    [d] = worker.claim(timeout=1)  # its 7th run, lost too; the dashboard's sweep finds it
    time.sleep(LEASE_MS / 1000 + 0.05)
    with served(web.create_app(client)) as base:
        status, swept = call(f"{base}/api/queue/belayq/long-jobs/sweep", {})
    assert status == 200 and swept["reclaimed"] == 1 and swept["dead_lettered"] == 0
    s = worker.stats()
    assert s["ready"] == 1 and s["dead"] == 0


def test_the_sweep_keeps_the_dead_letters_the_queues_cap_allows(
    client: redis.Redis, served: Any
) -> None:
    kept = 10_010  # more than belayq's default cap (10,000), fewer than this queue's
    q = ReliableQueue(client, "archive", keeper=False, lease_ms=LEASE_MS, max_deliveries=5,
                      dead_letter_max=20_000)
    q.publish_many([b"x"] * kept)
    for _ in range(0, kept, 1000):
        for d in q.claim(timeout=0, count=1000):
            q.dead_letter(d, "bad")
    assert q.stats()["dead"] == kept
    q.publish(b"last")
    run_and_lose(q, 4)
    q.claim(timeout=1)  # its 5th and last run is lost: the sweep dead-letters it
    time.sleep(LEASE_MS / 1000 + 0.05)
    with served(web.create_app(client)) as base:
        status, swept = call(f"{base}/api/queue/belayq/archive/sweep", {})
    assert status == 200 and swept["dead_lettered"] == 1
    s = q.stats()
    assert s["dead"] == kept + 1 and s.get("dead_dropped", 0) == 0


def test_the_sweep_of_an_rq_queue_leaves_the_last_run_to_rq(
    client: redis.Redis, served: Any
) -> None:
    layout: dict[str, Any] = rq_layout("reports")
    worker = ReliableQueue(client, "reports", keeper=False, lease_ms=LEASE_MS,
                           max_deliveries=5, exhausted="deliver", **layout)
    worker.publish(b"job-1")
    run_and_lose(worker, 4)
    worker.claim(timeout=1)  # its 5th and last run, lost
    time.sleep(LEASE_MS / 1000 + 0.05)
    with served(web.create_app(client)) as base:
        status, swept = call(f"{base}/api/queue/rq/reports/sweep", {})
    assert status == 200 and swept["dead_lettered"] == 0
    [final] = worker.claim(timeout=1)  # handed back once more, for RQ's FailedJobRegistry
    assert final.exhausted and worker.stats()["dead"] == 0


def test_no_sweep_of_a_queue_whose_limits_nobody_recorded(
    client: redis.Redis, served: Any
) -> None:
    client.sadd("rq:queues", "rq:queue:stock-only")
    client.rpush("rq:queue:stock-only", "job-9")
    client.hset("users", "42", "ada")
    with served(web.create_app(client)) as base:
        status, err = call(f"{base}/api/queue/rq/stock-only/sweep", {})
        assert status == 400 and "recorded" in err["error"]
        status, err = call(f"{base}/api/queue/kombu/users/purge", {"confirm": "users"})
        assert status == 404
    assert client.llen("rq:queue:stock-only") == 1 and client.hget("users", "42") == b"ada"
