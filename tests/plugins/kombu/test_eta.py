"""Native delayed delivery on belayq:// with real ``celery worker`` subprocesses: ETA and
countdown tasks wait in the queue's delayed set in Redis, not in a worker's memory, and
everything Celery users do with them keeps working (revoke, expires, retry with a
countdown, priorities, several queues, groups and chords), also across a rolling migration
from stock producers and workers and from belayq workers that held ETAs.
"""

from __future__ import annotations

import collections
import json
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import celery.exceptions
import kombu
import pytest
import redis

from tests.support import wait_for

from .conftest import Worker
from .test_celery_worker import Records, app, events
from .test_transport import core_queue, stats


def started_at(records: Records, i: Any) -> list[float]:
    return [r["t"] for r in records() if r["ev"] == "start" and r["i"] == i]


def test_a_countdown_task_waits_in_redis_and_runs_when_due(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    workers("--pool=prefork", "-c", "2").wait_ready()
    mod = app(celery_env)
    due = time.time() + 4.0
    result = mod.sleeper.apply_async((1, 0.0), countdown=4.0)
    time.sleep(1.0)
    s = stats(port, kq)
    # Not claimed by the worker: no lease for the keeper to extend, nothing in its memory.
    assert (s["delayed"], s["ready"], s["in_flight"]) == (1, 0, 0), s
    assert result.get(timeout=20) == 1
    [start] = started_at(records, 1)
    late = start - due
    print(f"\ncountdown=4 s: started {late * 1000:.0f} ms after its ETA")
    assert -0.05 <= late < 1.0
    # acks_late: the worker stores the result, then acks; the ack may land just after.
    wait_for(lambda: (s := stats(port, kq))["delayed"] == s["in_flight"] == 0, 10,
             lambda: f"the task to be acked: {stats(port, kq)}")
    assert stats(port, kq).get("deferred", 0) == 0


def test_native_delayed_delivery_can_be_turned_off(
    workers: Callable[..., Worker], celery_env: dict[str, str], port: int, kq: str
) -> None:
    # native_delayed_delivery=False: the worker holds the ETA task, leased and extended, as
    # belayq did before (and as the stock transport does, without the lease).
    workers("--pool=solo", BQ_NATIVE="0").wait_ready()
    mod = app(celery_env, BQ_NATIVE="0")
    result = mod.add.apply_async((2, 3), countdown=3.0)
    wait_for(lambda: stats(port, kq)["in_flight"] == 1, 10, "the worker to hold the ETA task")
    assert stats(port, kq)["delayed"] == 0
    assert result.get(timeout=20) == 5


def test_a_retry_with_a_countdown_waits_in_redis(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    workers("--pool=prefork", "-c", "1").wait_ready()
    mod = app(celery_env)
    result = mod.flaky.delay(5, 3.0)
    wait_for(lambda: events(records, "start")[5] == 1, 20, "the first run")
    wait_for(lambda: stats(port, kq)["delayed"] == 1, 10, "the retry to wait in Redis")
    # The first run's message is acked after its retry was published: once it is, nothing
    # is in flight (the retry is not held by the worker).
    wait_for(lambda: stats(port, kq)["in_flight"] == 0, 10, "the first run's ack")
    assert result.get(timeout=20) == 5
    first, second = started_at(records, 5)
    assert 3.0 <= second - first < 4.5, second - first


@pytest.mark.parametrize("restart", [False, True], ids=["same-worker", "worker-restarted"])
def test_revoke_of_a_delayed_task_holds_whatever_the_workers_remember(
    restart: bool, workers: Callable[..., Worker], celery_env: dict[str, str],
    records: Records, port: int, kq: str
) -> None:
    # A Celery worker forgets a revoke on restart (and after 3 h or 50,000 revokes); the
    # revoke is also kept in Redis, and a worker that claims the task when it falls due
    # hands the revoke to Celery, which marks the task REVOKED instead of running it.
    w = workers("--pool=solo").wait_ready()
    mod = app(celery_env)
    doomed = mod.sleeper.apply_async((1, 0.0), countdown=4.0)
    kept = mod.sleeper.apply_async((2, 0.0), countdown=4.0)
    doomed.revoke()
    if restart:
        w.kill9()
        workers("--pool=solo").wait_ready()
    with pytest.raises(celery.exceptions.TaskRevokedError):
        doomed.get(timeout=30)
    assert kept.get(timeout=30) == 2
    assert events(records, "start") == collections.Counter({2: 1})
    wait_for(lambda: stats(port, kq)["in_flight"] == 0, 10, "the revoked task to be acked")


def test_expires_before_the_eta_is_revoked_by_celery(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records
) -> None:
    workers("--pool=solo").wait_ready()
    mod = app(celery_env)
    result = mod.sleeper.apply_async((3, 0.0), countdown=3.0, expires=1.0)
    with pytest.raises(celery.exceptions.TaskRevokedError):
        result.get(timeout=30)
    assert events(records, "start")[3] == 0


def test_eta_tasks_keep_their_priority(celery_env: dict[str, str], url: str, kq: str) -> None:
    # Due together, they come back to their own priority lists: the urgent ones are
    # delivered first although they were published last. (A Celery worker then orders the
    # tasks it holds for their ETA by ETA, so this is read with a plain kombu consumer.)
    mod = app(celery_env)
    low = [mod.add.apply_async((i, 0), countdown=1.0, priority=9).id for i in range(3)]
    high = [mod.add.apply_async((i, 0), countdown=1.0, priority=0).id for i in range(3)]
    time.sleep(1.5)
    with kombu.Connection(url) as conn:
        q = conn.SimpleQueue(kq)
        got = []
        for _ in range(6):
            message = q.get(timeout=10)
            got.append(message.headers["id"])
            message.ack()
        q.close()
    assert set(got[:3]) == set(high) and set(got[3:]) == set(low), (got, high, low)


def test_eta_tasks_routed_to_several_queues(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    other = f"{kq}-b"
    workers("--pool=prefork", "-c", "2", "-Q", f"{kq},{other}").wait_ready()
    mod = app(celery_env)
    a = mod.sleeper.apply_async((1, 0.0), countdown=3.0, queue=kq)
    b = mod.sleeper.apply_async((2, 0.0), countdown=3.0, queue=other)
    time.sleep(1.0)
    assert stats(port, kq)["delayed"] == 1 and stats(port, other)["delayed"] == 1
    assert (a.get(timeout=20), b.get(timeout=20)) == (1, 2)
    assert {r["i"] for r in records() if r["ev"] == "start"} == {1, 2}


def test_a_group_and_a_chord_whose_members_have_countdowns(
    workers: Callable[..., Worker], celery_env: dict[str, str], port: int, kq: str
) -> None:
    from celery import chord, group

    workers("--pool=prefork", "-c", "2").wait_ready()
    mod = app(celery_env)
    g = group(mod.add.s(i, i).set(countdown=2.0 + i / 2) for i in range(4)).apply_async()
    c = chord(
        [mod.add.s(i, 1).set(countdown=2.0) for i in range(3)], mod.tsum.s()
    ).apply_async()
    time.sleep(0.5)
    assert stats(port, kq)["delayed"] >= 7
    assert g.get(timeout=30) == [0, 2, 4, 6]
    assert c.get(timeout=30) == 1 + 2 + 3


# -- the rolling migration -----------------------------------------------------------------


def test_an_eta_task_from_a_stock_producer_is_deferred_to_redis(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    # A stock redis:// producer pushes the ETA task onto the list; the belayq worker that
    # claims it gives it back to the delayed set (uncounted) instead of holding it.
    # The countdown leaves the worker time to start and claim it more than 1 s ahead of
    # its ETA (a shorter wait is held by Celery, as the stock transport does).
    stock_env = {**celery_env, "BQ_BROKER": f"redis://127.0.0.1:{port}/0"}
    mod = app(stock_env)
    workers("--pool=solo").wait_ready()
    due = time.time() + 10.0
    result = mod.sleeper.apply_async((4, 0.0), countdown=10.0)
    wait_for(lambda: stats(port, kq).get("deferred", 0) == 1, 30, "the deferral")
    s = stats(port, kq)
    assert (s["delayed"], s["in_flight"]) == (1, 0), s
    assert result.get(timeout=30) == 4
    [start] = started_at(records, 4)
    assert -0.05 <= start - due < 1.0
    wait_for(lambda: stats(port, kq).get("acked") == 1, 10, "the ack")
    d = stats(port, kq)
    assert (d["claimed"], d["deferred"]) == (2, 1), d


def test_an_eta_task_held_by_an_older_belayq_worker_comes_back_to_redis(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    # A worker that holds ETA tasks in memory (an older belayq, here native delivery off)
    # stops; the newer one defers what it hands back, and each task runs once, on time.
    old = workers("--pool=solo", BQ_NATIVE="0").wait_ready()
    mod = app(celery_env, BQ_NATIVE="0")
    due = time.time() + 12.0  # the new worker starts well before (a loaded machine too)
    results = [mod.sleeper.apply_async((i, 0.0), countdown=12.0) for i in range(3)]
    wait_for(lambda: stats(port, kq)["in_flight"] == 3, 10, "the old worker to hold them")
    old.stop()
    workers("--pool=solo").wait_ready()
    wait_for(lambda: stats(port, kq)["delayed"] == 3, 30, "the deferrals")
    assert stats(port, kq)["in_flight"] == 0
    assert [r.get(timeout=20) for r in results] == [0, 1, 2]
    assert events(records, "start") == collections.Counter({0: 1, 1: 1, 2: 1})
    assert all(-0.05 <= t - due < 1.5 for i in range(3) for t in started_at(records, i))


def test_a_stock_worker_gets_a_natively_delayed_task_only_when_due(
    celery_env: dict[str, str], port: int, kq: str
) -> None:
    # Mixed fleet: a task a belayq producer delayed is in no list until it falls due, so a
    # stock worker (BRPOP) cannot take it early. It is promoted by a belayq worker's sweep
    # (each one of the queue's consumers runs it every sweep_interval); with no belayq
    # worker on the queue it stays delayed: such a queue needs producers with
    # native_delayed_delivery=False (README).
    mod = app(celery_env)
    mod.add.apply_async((1, 2), countdown=1.0)
    with kombu.Connection(f"redis://127.0.0.1:{port}/0") as conn:
        q = conn.SimpleQueue(kq)
        with pytest.raises(q.Empty):
            q.get(timeout=1.5)  # due after 1 s, but no belayq worker promoted it
        assert stats(port, kq)["delayed"] == 1
        assert core_queue(port, kq).sweep().promoted == 1  # what a belayq worker's keeper does
        message = q.get(timeout=10)
        assert message.headers["task"] == "worker_app.add"
        message.ack()
        q.close()
    assert stats(port, kq)["delayed"] == 0


# -- what Redis keeps ----------------------------------------------------------------------


def test_a_revoke_is_remembered_in_redis_and_bounded(url: str, port: int) -> None:
    # What `AsyncResult.revoke()` publishes to the pidbox exchange is read on the way out.
    from belayq.revocations import Revocations

    with kombu.Connection(url, transport_options={"revokes_max": 3}) as conn:
        body = {"method": "revoke", "arguments": {"task_id": ["a", "b"]}}
        exchange = kombu.Exchange("celery.pidbox", "fanout")
        producer = conn.Producer(serializer="json")
        producer.publish(body, exchange=exchange, declare=[exchange])
        producer.publish({"method": "revoke", "arguments": {"task_id": "c"}},
                         exchange=exchange)
        producer.publish({"method": "ping", "arguments": {}}, exchange=exchange)
        producer.publish({"method": "revoke", "arguments": {"task_id": ["d", "e"]}},
                         exchange=exchange)
    record = Revocations(redis.Redis(port=port))
    assert record.revoked(["a", "b", "c", "d", "e", "z"]) == {"c", "d", "e"}  # capped at 3


def test_an_eta_message_from_kombu_alone_is_delayed_too(url: str, port: int, kq: str) -> None:
    # A kombu producer that sets Celery's eta header gets the same treatment; a consumer
    # that is no Celery worker receives it when due.
    from datetime import datetime, timedelta, timezone

    eta = (datetime.now(timezone.utc) + timedelta(seconds=2)).isoformat()
    with kombu.Connection(url) as conn:
        q = conn.SimpleQueue(kq)
        q.put({"x": 1}, headers={"eta": eta, "id": "t-1"})
        assert stats(port, kq)["delayed"] == 1
        started = time.time()
        message = q.get(timeout=10)
        assert message.payload == {"x": 1} and time.time() - started >= 1.5
        message.ack()
        q.close()
    assert core_queue(port, kq).stats()["acked"] == 1


def test_a_worker_holds_no_eta_task_and_keeps_no_lease_for_it(
    workers: Callable[..., Worker], celery_env: dict[str, str], port: int, kq: str
) -> None:
    # The tasks wait in Redis; `celery inspect scheduled` still lists them (read from Redis
    # by the worker that leads the queue: test_inspect_scheduled.py).
    w = workers("--pool=solo").wait_ready()
    mod = app(celery_env)
    ids = {mod.add.apply_async((i, i), countdown=30).id for i in range(5)}
    time.sleep(1.5)
    node = w.name.replace("%h", socket.gethostname())
    from .test_celery_worker import control

    out = control(celery_env, "inspect", "scheduled", "-d", node, "-t", "10", "--json")
    listed = json.loads(out.strip().splitlines()[-1])[node]
    assert {e["request"]["id"] for e in listed} == ids
    s = stats(port, kq)
    assert (s["delayed"], s["in_flight"]) == (5, 0), s
    w.proc.send_signal(signal.SIGTERM)
