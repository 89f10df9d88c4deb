"""Bad input reaching a real ``rq worker -w belayq_rq.Worker`` (docs/design.md §2.5).

An entry of ``rq:queue:NAME`` that is no job RQ can load (its hash was deleted or expired,
an id pushed by hand, bytes that are not an id at all, 20 MB of them, a hash RQ cannot
read) has no job to put in RQ's FailedJobRegistry: it goes to the core's dead-letter list
with the reason (stock RQ skips it silently). A job that loads but whose payload cannot be
deserialized fails inside the work horse, and lands in RQ's FailedJobRegistry with the
traceback, as with stock RQ. Either way the worker keeps running (same process, same RQ
worker name) and the jobs around the bad entry run exactly once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import rq
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

import belayq_rq
from belayq import DeadLetter
from belayq.embedded import RedisServer
from tests.plugins.rq import jobs
from tests.plugins.rq.conftest import Workers
from tests.support import wait_for

QUEUE = "bad"
TWENTY_MB = 20 * 1024 * 1024


@pytest.fixture(scope="module")
def worker(
    server: RedisServer, conn: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    ws = Workers(server.url, tmp_path_factory.mktemp("rq-bad"))
    proc = ws.start(QUEUE, worker_class="belayq_rq.Worker")
    wait_for(lambda: rq.Worker.all(connection=conn), 30, "the rq worker to register")
    proc.rq_name = rq.Worker.all(connection=conn)[0].name
    yield proc
    ws.stop_all()


def core(conn: redis.Redis) -> Any:
    return belayq_rq.Queue(QUEUE, connection=conn).belayq()


def ran_once(conn: redis.Redis, job: Job) -> None:
    starts = [r for r in conn.lrange(f"runs:{job.id}", 0, -1) if r.startswith(b"start")]
    assert len(starts) == 1, starts


def survives(
    conn: redis.Redis, worker: Any, push_bad: Callable[[rq.Queue], Any], reason: str
) -> DeadLetter:
    """A job, the bad entry, a job: both jobs finish once on the same worker, the bad entry
    is a dead letter whose reason holds ``reason``; returns it."""
    queue = rq.Queue(QUEUE, connection=conn)
    dead_before = {d.id for d in core(conn).dead_letters(1000)}
    first = queue.enqueue(jobs.record, "before")
    push_bad(queue)
    last = queue.enqueue(jobs.record, "after")
    wait_for(lambda: last.get_status() == JobStatus.FINISHED, 60, "the job after the bad one")
    assert first.get_status() == JobStatus.FINISHED
    new = wait_for(lambda: [d for d in core(conn).dead_letters(1000) if d.id not in dead_before],
                   10, "the bad entry to be dead-lettered")
    assert len(new) == 1, new
    assert reason in new[0].reason, new[0].reason
    for job in (first, last):
        ran_once(conn, job)
        assert Job.fetch(job.id, connection=conn).worker_name == worker.rq_name
    assert worker.poll() is None, Path(worker.log).read_text()[-3000:]
    assert [w.name for w in rq.Worker.all(connection=conn)] == [worker.rq_name]
    stats = core(conn).stats()
    assert stats["ready"] == stats["in_flight"] == 0, stats
    return new[0]


def test_a_job_id_whose_hash_is_missing_is_dead_lettered(conn, worker) -> None:
    missing = str(uuid.uuid4())
    dead = survives(conn, worker, lambda q: conn.rpush(q.key, missing), "no job hash")
    assert dead.id == missing and missing in dead.reason


def test_a_job_whose_hash_expired_while_it_waited_is_dead_lettered(conn, worker) -> None:
    expired: list[Job] = []

    def push(q: rq.Queue) -> None:
        q.enqueue(jobs.sleeper, 2.0)  # keeps the worker busy while the next one expires
        expired.append(q.enqueue(jobs.add, 1, 2, ttl=1))

    dead = survives(conn, worker, push, "ttl ran out")
    assert dead.id == expired[0].id


def test_an_id_pushed_by_hand_is_dead_lettered(conn, worker) -> None:
    # rq 2.8+ refuses the id itself; older rq looks for its hash and finds none.
    dead = survives(conn, worker, lambda q: conn.rpush(q.key, "not a job id!"), "belayq_rq")
    assert dead.payload == b"not a job id!"
    assert "Job ID must only contain" in dead.reason or "no job hash" in dead.reason, dead


def test_a_non_utf8_entry_is_dead_lettered(conn, worker) -> None:
    entry = b"\xff\xfe\x80garbage"
    dead = survives(conn, worker, lambda q: conn.rpush(q.key, entry), "UnicodeDecodeError")
    assert dead.payload == entry


def test_a_20_mb_entry_is_dead_lettered(conn, worker) -> None:
    entry = b"x" * TWENTY_MB
    dead = survives(conn, worker, lambda q: conn.rpush(q.key, entry), "no job hash")
    assert dead.payload == entry and len(dead.reason) <= 500


def test_a_job_hash_rq_cannot_read_is_dead_lettered(conn, worker) -> None:
    def push(q: rq.Queue) -> None:
        conn.hset("rq:job:corrupt", mapping={"data": b"\x00garbage", "created_at": "not a date"})
        conn.rpush(q.key, "corrupt")

    survives(conn, worker, push, "cannot load job 'corrupt'")


def test_a_job_whose_payload_does_not_deserialize_fails_in_rqs_registry(conn, worker) -> None:
    # The job hash is sound, its pickled call is not: RQ fails it in the work horse, with
    # the traceback in FailedJobRegistry, which is where an RQ user looks for it.
    queue = rq.Queue(QUEUE, connection=conn)
    first = queue.enqueue(jobs.record, "before")
    bad = Job.create(jobs.add, args=(1, 2), connection=conn, origin=QUEUE)
    bad.save()
    conn.hset(bad.key, "data", b"\x80not a pickle")
    conn.rpush(queue.key, bad.id)
    last = queue.enqueue(jobs.record, "after")
    wait_for(lambda: last.get_status() == JobStatus.FINISHED, 60, "the job after the bad one")
    assert first.get_status() == JobStatus.FINISHED
    wait_for(lambda: bad.id in FailedJobRegistry(QUEUE, connection=conn).get_job_ids(), 10,
             "the bad job in FailedJobRegistry")
    bad.refresh()
    assert bad.get_status() == JobStatus.FAILED
    result = bad.latest_result()
    assert result is not None and "Deserializ" in (result.exc_string or ""), result
    for job in (first, last):
        ran_once(conn, job)
    assert worker.poll() is None
    assert [w.name for w in rq.Worker.all(connection=conn)] == [worker.rq_name]
    time.sleep(0.2)
    stats = core(conn).stats()
    assert stats["ready"] == stats["in_flight"] == 0, stats


def test_a_job_id_longer_than_64_characters_runs(conn, worker) -> None:
    # The core names such an entry by its SHA1; the adapter must still fetch the job by
    # the entry itself (it used to look it up by the SHA1 and drop it as missing).
    job = rq.Queue(QUEUE, connection=conn).enqueue(jobs.record, "long", job_id="j" * 100)
    wait_for(lambda: job.get_status() == JobStatus.FINISHED, 30, "the long-id job")
    ran_once(conn, job)
