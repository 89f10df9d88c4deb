"""Bad input reaching a real ``celery worker`` on ``belayq://`` (docs/design.md §2.5): each ends in
the queue's dead-letter list with a reason, the worker keeps running (a normal task
published after the bad one runs in the same process), and the tasks around it run
exactly once.

One solo worker (tasks run in the worker's own process, so any exception that escaped the
consumer would stop everything) serves every test of this module, in order.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq.embedded import RedisServer
from tests.conftest import client_of
from tests.support import wait_for

from .helpers import APP, CeleryWorker, celery_app, kombu_core, runs

TWENTY_MB = 20 * 1024 * 1024
RECORDS = "records"


@pytest.fixture(scope="module")
def kq() -> str:
    return f"bad-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def env(server: RedisServer, kq: str) -> dict[str, str]:
    return {
        "BQ_BROKER": f"belayq://127.0.0.1:{server.port}/0",
        "BQ_BACKEND": f"redis://127.0.0.1:{server.port}/1",
        "BQ_QUEUE": kq,
        "BQ_RECORDS": RECORDS,
    }


@pytest.fixture(scope="module")
def worker(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[CeleryWorker]:
    log = tmp_path_factory.mktemp("celery-bad") / "worker.log"
    w = CeleryWorker(log, "--pool=solo", **env).wait_ready()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def app(env: dict[str, str]) -> Any:
    return celery_app(env)


@pytest.fixture
def lone(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[CeleryWorker, Any, str]]:
    """A worker of its own on a queue of its own, for bad input that may stop a worker:
    the worker, the producer app and the queue."""
    kq = f"lone-{uuid.uuid4().hex[:8]}"
    mine = {**env, "BQ_QUEUE": kq}
    w = CeleryWorker(tmp_path / "worker.log", "--pool=solo", **mine).wait_ready()
    yield w, celery_app(mine), kq
    w.stop()


@pytest.fixture(scope="module")
def records(server: RedisServer) -> Iterator[redis.Redis]:
    with client_of(server, db=1) as c:
        yield c


def survives(
    worker: CeleryWorker, app: Any, conn: redis.Redis, records: redis.Redis, kq: str,
    push_bad: Callable[[], None], reason: str,
) -> Any:
    """Publish a task, the bad input, another task; both tasks run once in the worker's own
    process, the bad input is a dead letter whose reason holds ``reason``; returns it."""
    tag = uuid.uuid4().hex[:8]
    core = kombu_core(conn, kq)
    dead_before = {d.id for d in core.dead_letters(1000)}
    first = app.record.delay(f"{tag}-before")
    push_bad()
    last = app.record.delay(f"{tag}-after")
    wait_for(lambda: last.ready() or not worker.alive(), 60, "the task after the bad input")
    assert worker.alive(), worker.text()[-3000:]
    assert last.get(timeout=5) == 0 and first.get(timeout=5) == 0
    new = wait_for(lambda: [d for d in core.dead_letters(1000) if d.id not in dead_before],
                   5, "the bad input to be dead-lettered")
    assert len(new) == 1, new
    assert reason in new[0].reason, new[0].reason
    mine = [r for r in runs(records, RECORDS) if r["tag"].startswith(tag)]
    assert sorted(r["tag"] for r in mine) == [f"{tag}-after", f"{tag}-before"]
    assert {r["pid"] for r in mine} == {worker.pid}, "a task ran outside the first process"
    assert worker.alive(), worker.text()[-3000:]
    def acked() -> dict[str, Any] | None:
        stats: dict[str, Any] = core.stats()
        return stats if stats["in_flight"] == 0 else None

    # The worker sends its acks at its loop's next tick, without waiting for them.
    stats = wait_for(acked, 5, lambda: f"the tasks' acks: {core.stats()}")
    assert stats["ready"] == 0, stats
    return new[0]


def task_envelope(app: Any, name: str, kq: str, body: bytes | None = None) -> dict[str, Any]:
    """A stock kombu/Celery envelope (as a producer writes it to the list), for task ``name``;
    ``body`` replaces the (base64) body when given."""
    import base64

    msg = app.app.amqp.as_task_v2(uuid.uuid4().hex, name, args=("x",), kwargs={})
    raw = json.dumps(msg.body).encode() if body is None else body
    return {
        "body": base64.b64encode(raw).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": msg.headers,
        "properties": {
            "correlation_id": msg.headers["id"],
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": kq},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": uuid.uuid4().hex,
        },
    }


def test_a_non_json_entry_is_dead_lettered(worker, app, conn, records, kq) -> None:
    survives(worker, app, conn, records, kq,
             lambda: conn.lpush(kq, b"this is not json {"), "JSONDecodeError")


def test_an_id_pushed_into_the_list_by_hand_is_dead_lettered(worker, app, conn, records, kq):
    survives(worker, app, conn, records, kq,
             lambda: conn.rpush(kq, uuid.uuid4().hex), "not a kombu message")


@pytest.mark.parametrize("size", [8, 200], ids=["short", "long"])
def test_a_non_utf8_entry_is_dead_lettered(worker, app, conn, records, kq, size) -> None:
    entry = (b"\xff\xfe\x80" * size)[:size]
    dead = survives(worker, app, conn, records, kq,
                    lambda: conn.lpush(kq, entry), "UnicodeDecodeError")
    assert dead.payload == entry


def test_json_that_is_not_an_envelope_is_dead_lettered(worker, app, conn, records, kq):
    survives(worker, app, conn, records, kq,
             lambda: conn.lpush(kq, b'[1, 2, "three"]'), "not a kombu message")


def test_a_20_mb_garbage_entry_is_dead_lettered(worker, app, conn, records, kq) -> None:
    blob = b"\x00garbage" * (TWENTY_MB // 8)
    dead = survives(worker, app, conn, records, kq,
                    lambda: conn.lpush(kq, blob), "not a kombu message")
    assert len(dead.payload) == len(blob)


def test_a_20_mb_task_runs_once(worker, app, conn, records, kq) -> None:
    # Size alone is not malformed: a valid 20 MB task runs (Redis caps a value at 512 MB).
    tag = uuid.uuid4().hex[:8]
    result = app.record.delay(tag, "x" * TWENTY_MB)
    assert result.get(timeout=60) == TWENTY_MB
    assert [r["pid"] for r in runs(records, RECORDS) if r["tag"] == tag] == [worker.pid]


def test_an_unknown_task_is_dead_lettered(worker, app, conn, records, kq) -> None:
    # Stock Celery logs "Received unregistered task" and rejects it (requeue=False): the
    # stock transport drops it; belayq dead-letters rejected messages.
    survives(worker, app, conn, records, kq,
             lambda: app.app.send_task("no.such.task", args=(1,)), "reject")
    assert "Received unregistered task of type 'no.such.task'" in worker.text()


def test_the_reason_of_an_unknown_task_names_it(worker, app, conn, records, kq) -> None:
    survives(worker, app, conn, records, kq,
             lambda: app.app.send_task("no.such.task", args=(1,)), "no.such.task")


def test_an_envelope_without_task_headers_is_dead_lettered(worker, app, conn, records, kq):
    envelope = task_envelope(app, f"{APP}.record", kq)
    envelope["headers"] = {}
    survives(worker, app, conn, records, kq,
             lambda: conn.lpush(kq, json.dumps(envelope)), "reject")


def test_a_task_whose_body_is_not_json_is_dead_lettered(worker, app, conn, records, kq):
    envelope = task_envelope(app, f"{APP}.record", kq, body=b"not json {")
    survives(worker, app, conn, records, kq,
             lambda: conn.lpush(kq, json.dumps(envelope)), "decode")


def test_an_envelope_with_a_broken_body_encoding_is_dead_lettered(lone, conn, records):
    worker, app, kq = lone
    envelope = task_envelope(app, f"{APP}.record", kq)
    envelope["body"] = "%%% not base64 %%%"
    survives(worker, app, conn, records, kq,
             lambda: conn.lpush(kq, json.dumps(envelope)), "delivery failed")


def test_an_envelope_whose_properties_are_not_an_object_is_dead_lettered(lone, conn, records):
    worker, app, kq = lone
    envelope = task_envelope(app, f"{APP}.record", kq)
    envelope["properties"] = 5
    survives(worker, app, conn, records, kq,
             lambda: conn.lpush(kq, json.dumps(envelope)), "not a kombu message")
