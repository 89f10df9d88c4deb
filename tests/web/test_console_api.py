"""The dashboard's console API on a real server, served by uvicorn, with real RQ workers
and Celery's own producer: the overview's rates, ages and the framework's failures, a
message's detail for each kind, search by id, deleting dead letters, requeuing and deleting
RQ's failed jobs, the per-minute history, and the log of actions. Every bad request is
refused with a message and changes nothing."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import redis
import rq
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq://)
import belayq_rq
from belayq import ReliableQueue, failures
from belayq.keys import kombu_layout
from tests.plugins.rq import jobs

from .test_dashboard import call

web = pytest.importorskip("belayq.web")


def rows_by_name(base: str) -> dict[str, dict[str, Any]]:
    status, o = call(f"{base}/api/overview")
    assert status == 200
    return {q["queue"]: q for q in o["queues"]}


def test_the_overview_rates_and_ages(client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "emails", keeper=False, lease_ms=60_000)
    q.publish_many([b"a", b"b", b"c"])
    [held] = q.claim(timeout=0)
    with served(web.create_app(client)) as base:
        first = rows_by_name(base)["emails"]
        assert first["in_per_min"] is None  # one look: no rate yet
        assert (first["ready"], first["in_flight"], first["failed"]) == (2, 1, None)
        assert first["oldest_ready_s"] is not None and first["oldest_ready_s"] >= 0
        assert first["running_for_s"] is not None and first["running_for_s"] < 5
        q.publish_many([b"d"] * 6)
        q.ack(held)
        time.sleep(1)
        row = rows_by_name(base)["emails"]
        assert row["in_per_min"] > 0 and row["out_per_min"] > 0
        # 6 in and 1 out over about a second: the ratio holds whatever the pace
        assert row["in_per_min"] == pytest.approx(6 * row["out_per_min"], rel=0.01)


def test_a_core_message_detail_and_search(client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "orders", keeper=False)
    other = ReliableQueue(client, "emails", keeper=False)
    waiting = q.publish(b'{"order": 17, "items": [1, 2]}')
    text = q.publish(b"plain \xff bytes")
    other.publish(b"x")
    with served(web.create_app(client)) as base:
        api = f"{base}/api/queue/belayq/orders/message"
        status, d = call(f"{api}/{waiting}")
        assert status == 200
        assert (d["state"], d["payload"]["json"]) == ("ready", {"order": 17, "items": [1, 2]})
        status, d = call(f"{api}/{text}")
        assert d["payload"]["text"] == "plain \\xff bytes" and d["payload"]["json"] is None
        [got] = q.claim(timeout=0)
        status, d = call(f"{api}/{got.id}")
        assert d["state"] == "in flight" and d["deliveries"] == 1 and d["lease_left_s"] > 0
        q.dead_letter(got, "it broke")
        status, d = call(f"{api}/{got.id}")
        assert (d["state"], d["error"]) == ("dead", "it broke")
        assert call(f"{api}/nope")[0] == 404
        status, found = call(f"{base}/api/search?id={text}")
        assert found["found"] == [{"kind": "belayq", "queue": "orders", "state": "ready",
                                   "id": text}]
        assert call(f"{base}/api/search?id=")[0] == 400
        assert call(f"{base}/api/search?id=nothing-has-this")[1]["found"] == []


def test_a_celery_task_detail(client: redis.Redis, served: Any) -> None:
    port = client.connection_pool.connection_kwargs["port"]
    app = Celery("shop", broker=f"belayq://127.0.0.1:{port}/0")
    sent = app.send_task("shop.charge", args=(42, "EUR"), kwargs={"retry": True},
                         queue="billing", countdown=0)
    with served(web.create_app(client)) as base:
        status, d = call(f"{base}/api/queue/kombu/billing")
        [row] = d["ready"]
        assert (row["task"], row["task_id"]) == ("shop.charge", sent.id)
        status, m = call(f"{base}/api/queue/kombu/billing/message/{row['id']}")
        assert status == 200 and m["state"] == "ready"
        task = m["payload"]["celery"]
        assert (task["task"], task["id"], task["args"], task["kwargs"]) == (
            "shop.charge", sent.id, [42, "EUR"], {"retry": True})
        assert task["root_id"] == sent.id and task["retries"] == 0
        status, found = call(f"{base}/api/search?id={row['id']}")
        assert found["found"] == [{"kind": "kombu", "queue": "billing", "state": "ready",
                                   "id": row["id"]}]
    kombu = ReliableQueue(client, "billing", keeper=False, **kombu_layout("billing"))
    assert kombu.stats()["ready"] == 1  # reading changed nothing


def test_rq_failures_requeued_and_deleted_from_the_api(client: redis.Redis,
                                                        served: Any) -> None:
    producer = rq.Queue("reports", connection=client)
    failing = [producer.enqueue(jobs.fail) for _ in range(3)]
    belayq_rq.SimpleWorker(["reports"], connection=client).work(burst=True,
                                                               logging_level="WARNING")
    registry = rq.registry.FailedJobRegistry("reports", connection=client)
    assert registry.count == 3
    with served(web.create_app(client)) as base:
        assert rows_by_name(base)["reports"]["failed"] == 3
        api = f"{base}/api/queue/rq/reports"
        status, d = call(api)
        failed = d["framework_failed"]
        assert failed["count"] == 3 and failed["can_retry"]
        assert {r["id"] for r in failed["rows"]} == {j.id for j in failing}
        assert all(r["reason"] == "ValueError: this job always fails" for r in failed["rows"])
        status, m = call(f"{api}/message/{failing[0].id}")
        job = m["framework"]
        assert job["function"] == "tests.plugins.rq.jobs.fail" and job["status"] == "failed"
        assert "Traceback" in job["exc_info"] and "this job always fails" in job["exc_info"]

        assert call(f"{api}/retry", {"ids": []})[0] == 400
        assert call(f"{api}/retry", {"all": True})[0] == 400  # unconfirmed
        assert call(f"{api}/delete", {"ids": [failing[0].id], "from": "elsewhere"})[0] == 400
        assert registry.count == 3
        assert call(f"{api}/retry", {"ids": [failing[0].id, "no-such-job"]}) == (
            200, {"requeued": 1})
        assert registry.count == 2 and producer.job_ids == [failing[0].id]
        assert call(f"{api}/delete", {"ids": [failing[1].id], "from": "failed"}) == (
            200, {"deleted": 1})
        assert registry.count == 1 and not client.exists(failing[1].key)
        assert call(f"{api}/retry", {"all": True, "confirm": "reports"}) == (
            200, {"requeued": 1})
        assert registry.count == 0 and producer.count == 2
        status, d = call(api)
        logged = [(a["action"], a.get("requeued", a.get("deleted"))) for a in d["actions"]]
        assert logged == [("retry", 1), ("delete", 1), ("retry", 1)]  # newest first
        assert all(a["by"] == "127.0.0.1" and a["ms"] > 0 for a in d["actions"])


def test_dead_letters_deleted_from_the_api(client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish_many([b"a", b"b", b"c"])
    held = q.claim(timeout=0, count=3)
    for d in held:
        q.dead_letter(d, "bad")
    with served(web.create_app(client)) as base:
        api = f"{base}/api/queue/belayq/jobs"
        assert call(f"{api}/delete", {"ids": [held[0].id]}) == (200, {"deleted": 1})
        assert call(f"{api}/delete", {"all": True, "confirm": "nope"})[0] == 400
        assert q.stats()["dead"] == 2
        assert call(f"{api}/delete", {"all": True, "confirm": "jobs"}) == (200, {"deleted": 2})
        assert q.stats()["dead"] == 0 and client.hlen(q.keys.payloads) == 0
        status, d = call(api)
        assert [a["action"] for a in d["actions"]] == ["delete", "delete"]
        assert call(f"{api}/retry", {"ids": ["x"]})[0] == 400  # no failed jobs of its own


def test_the_per_minute_history(client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    minute = 29_500_000
    for i, acked in enumerate((0, 30, 90)):
        client.hset(q.keys.rollups, str(minute + i), f"{acked} 0 {acked} 0 0 0 0 0")
    with served(web.create_app(client)) as base:
        status, d = call(f"{base}/api/queue/belayq/jobs")
        assert [(p["t"], p["acked"]) for p in d["per_minute"]] == [
            ((minute + 1) * 60_000, 30), ((minute + 2) * 60_000, 60)]


def test_the_history_kept_is_the_one_recorded(client: redis.Redis, served: Any) -> None:
    """The dashboard opens a queue keeping no history itself; it says what the queue's own
    processes keep, as they recorded it."""
    kept = ReliableQueue(client, "kept", keeper=False, history_max=20)
    kept.publish(b"a")
    kept.ack(kept.claim(timeout=0)[0], result="done")
    ReliableQueue(client, "plain", keeper=False).publish(b"b")
    with served(web.create_app(client)) as base:
        status, d = call(f"{base}/api/queue/belayq/kept")
        assert d["history_max"] == 20 and [h["result"] for h in d["completed"]] == ["done"]
        status, d = call(f"{base}/api/queue/belayq/plain")
        assert d["history_max"] == 0 and d["completed"] == []


def test_pause_resume_and_who_holds_what_from_the_api(client: redis.Redis,
                                                      served: Any) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish_many([b"a", b"b", b"c"])
    held = q.claim(timeout=0, count=2)
    with served(web.create_app(client)) as base:
        api = f"{base}/api/queue/belayq/jobs"
        assert call(f"{api}/pause", {}) == (200, {"paused": True})
        assert call(f"{api}/pause", {}) == (200, {"paused": False})  # already
        assert q.claim(timeout=0) == [] and rows_by_name(base)["jobs"]["paused"] is True
        status, d = call(api)
        [holder] = d["consumers"]
        assert holder["leases"] == 2 and holder["holder"].endswith(f":{os.getpid()}")
        assert q.ack_many(held) == [True, True]  # held claims settle while paused
        assert call(f"{api}/resume", {}) == (200, {"resumed": True})
        assert [d.payload for d in q.claim(timeout=0)] == [b"c"]
        status, d = call(api)
        assert [a["action"] for a in d["actions"]] == ["resume", "pause", "pause"]
        assert d["actions"][0]["by"] == "127.0.0.1"
        assert call(f"{base}/api/queue/belayq/nope/pause", {})[0] == 404


def test_celery_failed_runs_are_listed_opened_and_deleted_not_requeued(
        client: redis.Redis, served: Any) -> None:
    port = client.connection_pool.connection_kwargs["port"]
    Celery("shop", broker=f"belayq://127.0.0.1:{port}/0").send_task("shop.ok", queue="charges")
    kombu = ReliableQueue(client, "charges", keeper=False, **kombu_layout("charges"))
    failures.record(kombu, "task-1", 1_000, {"framework": "celery", "task": "shop.charge",
                                             "reason": "ValueError: no", "exc_info": "Tb"})
    with served(web.create_app(client)) as base:
        assert rows_by_name(base)["charges"]["failed"] == 1
        api = f"{base}/api/queue/kombu/charges"
        status, d = call(api)
        assert d["framework_failed"] == {"count": 1, "can_retry": False, "rows": [
            {"id": "task-1", "task": "shop.charge", "failed_at_ms": 1_000,
             "reason": "ValueError: no"}]}
        status, m = call(f"{api}/message/task-1")
        assert status == 200 and m["state"] == "failed"  # the framework's word
        assert (m["framework"]["status"], m["framework"]["exc_info"]) == ("failed", "Tb")
        status, refused = call(f"{api}/retry", {"ids": ["task-1"]})
        assert status == 400 and "retry policy" in refused["error"]
        assert failures.count(kombu) == 1
        assert call(f"{api}/delete", {"ids": ["task-1"], "from": "failed"}) == (
            200, {"deleted": 1})
        assert failures.count(kombu) == 0
    assert kombu.stats()["ready"] == 1
