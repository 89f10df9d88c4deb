"""Search by the ids users have: a Celery task id, an RQ job id, a Dramatiq ``message_id`` or
belayq's id, in every state, each found by the API's search and opened by the message
detail; and its cost is bounded: no command compares a whole backlog (docs/operations.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq://)
from belayq import ReliableQueue
from belayq.keys import kombu_layout, rq_layout
from belayq.lookup import LPOS_MAXLEN, STEP, WINDOW
from belayq_dramatiq import Broker

from .test_dashboard import call

web = pytest.importorskip("belayq.web")


def found(base: str, wanted: str) -> list[tuple[str, str, str]]:
    status, answer = call(f"{base}/api/search?id={wanted}")
    assert status == 200, answer
    return [(f["kind"], f["queue"], f["state"]) for f in answer["found"]]


def test_search_finds_a_celery_task_by_its_task_id_in_every_state(
        client: redis.Redis, served: Any) -> None:
    port = client.connection_pool.connection_kwargs["port"]
    app = Celery("shop", broker=f"belayq://127.0.0.1:{port}/0")
    core = ReliableQueue(client, "invoices", keeper=False, **kombu_layout("invoices"))
    dead = app.send_task("shop.charge", args=(1,), queue="invoices")
    [d] = core.claim(timeout=0)
    core.dead_letter(d, "card declined")
    running = app.send_task("shop.charge", args=(2,), queue="invoices")
    [held] = core.claim(timeout=0)
    waiting = app.send_task("shop.charge", args=(3,), queue="invoices")
    later = app.send_task("shop.charge", args=(4,), queue="invoices", countdown=600)
    with served(web.create_app(client)) as base:
        for sent, state in ((waiting, "ready"), (later, "delayed"), (running, "in flight"),
                            (dead, "dead")):
            assert found(base, sent.id) == [("kombu", "invoices", state)], state
            status, m = call(f"{base}/api/queue/kombu/invoices/message/{sent.id}")
            assert status == 200 and m["state"] == state
            assert m["payload"]["celery"]["id"] == sent.id
        status, answer = call(f"{base}/api/search?id={running.id}")
        assert answer["found"][0]["id"] == held.id  # belayq's id of it, to open it by
        assert found(base, held.id) == [("kombu", "invoices", "in flight")]
        assert found(base, "no-task-has-this-id") == []
    app.close()


def test_search_finds_rq_job_ids_and_dramatiq_message_ids(
        client: redis.Redis, served: Any) -> None:
    rq = ReliableQueue(client, "default", keeper=False, **rq_layout("default"))
    rq.publish_many([f"job-{i}".encode() for i in range(3)])
    [claimed] = rq.claim(timeout=0)
    port = client.connection_pool.connection_kwargs["port"]
    broker = Broker(url=f"redis://127.0.0.1:{port}/0")

    @dramatiq.actor(broker=broker, queue_name="mail")
    def deliver(address: str) -> None:
        raise AssertionError("no worker runs here")

    waiting = deliver.send("ann@example.com")
    later = deliver.send_with_options(args=("bob@example.com",), delay=3_600_000)
    doomed = deliver.send("cy@example.com")
    core = broker.store("mail").core
    claims = core.claim(timeout=0, count=2)
    [dead] = [c for c in claims if doomed.message_id in c.payload.decode()]
    core.dead_letter(dead, "gave up")
    queued = deliver.send("dee@example.com")  # waits: its list entry is another id
    with served(web.create_app(client)) as base:
        assert found(base, "job-2") == [("rq", "default", "ready")]
        assert found(base, claimed.id) == [("rq", "default", "in flight")]
        for sent, state in ((queued, "ready"), (waiting, "in flight"), (later, "delayed"),
                            (doomed, "dead")):
            assert found(base, sent.message_id) == [("dramatiq", "mail", state)], state
            status, m = call(f"{base}/api/queue/dramatiq/mail/message/{sent.message_id}")
            assert status == 200 and m["state"] == state
            assert m["framework"]["message_id"] == sent.message_id
    broker.close()


@pytest.fixture
def slowlog(client: redis.Redis) -> Iterator[redis.Redis]:
    """Every command the server runs from here on, in its slow log (restored after)."""
    before = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    yield client
    client.config_set("slowlog-log-slower-than", before["slowlog-log-slower-than"])
    client.config_set("slowlog-max-len", before["slowlog-max-len"])


def test_search_cost_is_bounded_on_a_large_backlog(
        client: redis.Redis, served: Any, slowlog: redis.Redis) -> None:
    """On an RQ backlog of 3 x LPOS_MAXLEN jobs and a kombu one of 3 x WINDOW envelopes, a
    search compares at most LPOS_MAXLEN entries per command and reads at most STEP per
    command: the ends of a backlog are found, its middle is not (as documented)."""
    rq = ReliableQueue(client, "bulk", keeper=False, **rq_layout("bulk"))
    total = 3 * LPOS_MAXLEN
    for start in range(0, total, 5_000):
        rq.publish_many([f"job-{i}".encode() for i in range(start, start + 5_000)])
    kombu = ReliableQueue(client, "celery", keeper=False, **kombu_layout("celery"))
    kombu.publish_many([json.dumps({"headers": {"id": f"task-{i}", "task": "t"},
                                    "body": "e30="}).encode() for i in range(3 * WINDOW)])
    with served(web.create_app(client)) as base:
        client.slowlog_reset()
        assert found(base, "job-0") == [("rq", "bulk", "ready")]
        assert found(base, f"job-{total - 1}") == [("rq", "bulk", "ready")]
        assert found(base, f"job-{total // 2}") == []  # beyond LPOS_MAXLEN from either end
        assert found(base, "task-0") == [("kombu", "celery", "ready")]
        assert found(base, f"task-{3 * WINDOW - 1}") == [("kombu", "celery", "ready")]
        assert found(base, f"task-{3 * WINDOW // 2}") == []  # beyond WINDOW from either end
        log = slowlog.slowlog_get(100_000)
    commands = [[a.decode() if isinstance(a, bytes) else str(a) for a in e["command"].split()]
                if isinstance(e["command"], (bytes, str)) else e["command"] for e in log]
    lpos = [c for c in commands if c[0].upper() == "LPOS"]
    assert lpos and all("MAXLEN" in (a.upper() for a in c) for c in lpos), lpos[:3]
    for c in lpos:
        assert int(c[[a.upper() for a in c].index("MAXLEN") + 1]) <= LPOS_MAXLEN
    for c in commands:
        if c[0].upper() in ("LRANGE", "ZRANGE", "ZREVRANGE"):
            assert int(c[3]) - int(c[2]) + 1 <= max(STEP, WINDOW), c
            if c[0].upper() == "LRANGE":
                assert int(c[3]) - int(c[2]) + 1 <= STEP and int(c[3]) >= 0, c
        assert c[0].upper() not in ("SCAN", "HSCAN", "KEYS"), c
