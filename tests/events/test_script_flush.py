"""``SCRIPT FLUSH`` and ``FUNCTION FLUSH`` (or a restart that empties the script cache)
between a claim and its settlement must not change the outcome: the core loads its scripts
or library again, and the adapters' settle paths (RQ's finishing transaction, Celery's acks)
still ack. The core's tests run both ways (``lua_functions`` False and True).

Each test starts its own redis-server (the flush empties the whole server's cache).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import rq
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

import belayq_rq
from belayq import ReliableQueue
from belayq.embedded import RedisServer
from tests.conftest import ON_BOTH
from tests.events import rq_jobs
from tests.events.servers import flush_lua, supports_functions
from tests.events.workers import Proc, child_env
from tests.support import wait_for

RQ_BIN = Path(sys.executable).with_name("rq")
STEPS = (0, 3, 6, 9)


# -- (c1) the core ---------------------------------------------------------------------------


@pytest.fixture(params=["scripts", "functions"])
def lua(request: pytest.FixtureRequest, conn: redis.Redis) -> str:
    """How the queue runs its transitions: EVALSHA of scripts (flushed by SCRIPT FLUSH), or
    FCALL of the library (flushed by FUNCTION FLUSH; Redis 7.0+)."""
    if request.param == "functions" and not supports_functions(conn):
        pytest.skip("Redis < 7.0 has no functions")
    return str(request.param)


def _claimed(conn: redis.Redis, lua: str, n: int = 1) -> tuple[ReliableQueue, list[Any]]:
    q = ReliableQueue(
        conn,
        f"flush-{uuid.uuid4().hex[:8]}",
        keeper=False,
        lease_ms=5_000,
        lua_functions=lua == "functions",
    )
    for i in range(n + 1):
        q.publish(f"m{i}".encode())
    got = q.claim(timeout=1.0, count=n)
    assert len(got) == n
    return q, got


@ON_BOTH
def test_core_ack_after_script_flush(conn: redis.Redis, lua: str) -> None:
    q, [d] = _claimed(conn, lua)
    flush_lua(conn)
    assert q.ack(d) is True
    s = q.stats()
    assert (s["in_flight"], s["acked"], s["ready"]) == (0, 1, 1), s
    [nxt] = q.claim(timeout=1.0)  # the claim path after a flush too
    flush_lua(conn)
    assert q.ack_many([nxt]) == [True]
    assert q.stats()["in_flight"] == 0


@ON_BOTH
def test_core_nack_after_script_flush(conn: redis.Redis, lua: str) -> None:
    q, [d] = _claimed(conn, lua)
    flush_lua(conn)
    assert q.nack(d, delay_ms=0, reason="flushed") == "ready"
    s = q.stats()
    assert (s["in_flight"], s["ready"]) == (0, 2), s


@ON_BOTH
def test_core_dead_letter_after_script_flush(conn: redis.Redis, lua: str) -> None:
    q, [d] = _claimed(conn, lua)
    flush_lua(conn)
    assert q.dead_letter(d, "flushed") is True
    [dead] = q.dead_letters()
    assert dead.id == d.id and dead.reason.startswith("flushed")


@ON_BOTH
def test_core_extend_after_script_flush(conn: redis.Redis, lua: str) -> None:
    q, ds = _claimed(conn, lua, 2)
    flush_lua(conn)
    assert q.extend(ds) == [True, True]
    flush_lua(conn)
    assert q.ack_many(ds) == [True, True]


@ON_BOTH
def test_core_release_after_script_flush(conn: redis.Redis, lua: str) -> None:
    q, ds = _claimed(conn, lua, 2)
    flush_lua(conn)
    assert q.release(ds) == 2
    s = q.stats()
    assert (s["in_flight"], s["ready"]) == (0, 3), s


@ON_BOTH
def test_core_ack_and_claim_after_script_flush(conn: redis.Redis, lua: str) -> None:
    q, [d] = _claimed(conn, lua)
    flush_lua(conn)
    acked, more = q.ack_and_claim([d], 1)
    assert acked == [True] and len(more) == 1
    assert q.ack(more[0]) is True


@ON_BOTH
def test_core_ack_on_the_callers_transaction_after_script_flush(
    conn: redis.Redis, lua: str
) -> None:
    """The RQ path: the ack is an EVALSHA queued in the caller's MULTI/EXEC. After a flush
    the transaction must still commit everything, the ack included."""
    q, [d] = _claimed(conn, lua)
    key = f"x-{uuid.uuid4().hex[:6]}"
    flush_lua(conn)
    with conn.pipeline() as p:
        q.ack_on(p, [d])
        p.set(key, 1)
        replies = p.execute()
    assert conn.get(key) == b"1"
    assert [int(x) for x in replies[0]] == [1], replies
    s = q.stats()
    assert (s["in_flight"], s["acked"]) == (0, 1), s


@ON_BOTH
def test_core_ack_on_a_plain_pipeline_after_script_flush(conn: redis.Redis, lua: str) -> None:
    q, [d] = _claimed(conn, lua)
    flush_lua(conn)
    with conn.pipeline(transaction=False) as p:
        q.ack_on(p, [d])
        p.ping()
        p.execute()
    assert q.stats()["in_flight"] == 0


# -- (c2) RQ -------------------------------------------------------------------------------


def _rq_worker(procs: Callable[..., Proc], server: RedisServer, worker_class: str) -> Proc:
    cmd = [str(RQ_BIN), "worker", "-u", server.url, "-w", worker_class, "--logging_level",
           "INFO", "q1"]
    return procs(cmd, child_env())


def _runs(conn: redis.Redis, job_id: str) -> list[str]:
    return [x.decode().split(":")[0] for x in conn.lrange(f"runs:{job_id}", 0, -1)]


def _callbacks(conn: redis.Redis, job_id: str) -> list[str]:
    return [x.decode() for x in conn.lrange(f"callbacks:{job_id}", 0, -1)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_class", ["belayq_rq.Worker", "belayq_rq.SimpleWorker"],
                         ids=["Worker", "SimpleWorker"])
def test_rq_job_that_flushes_the_script_cache_finishes(
    conn: redis.Redis, server: RedisServer, procs: Callable[..., Proc], worker_class: str
) -> None:
    w = _rq_worker(procs, server, worker_class)
    q = rq.Queue("q1", connection=conn)
    job = q.enqueue(rq_jobs.flush_scripts_then_return, "the-result",
                    on_success=rq.Callback(rq_jobs.on_success),
                    on_failure=rq.Callback(rq_jobs.on_failure))

    def settled() -> bool:
        return Job.fetch(job.id, connection=conn).get_status() in (
            JobStatus.FINISHED, JobStatus.FAILED)

    wait_for(settled, 60, f"the job to settle\n{w.text()[-3000:]}", step=0.1)
    fetched = Job.fetch(job.id, connection=conn)
    failed = FailedJobRegistry("q1", connection=conn).get_job_ids()
    exc = fetched.latest_result().exc_string if fetched.latest_result() else None
    assert fetched.get_status() == JobStatus.FINISHED, (
        f"status {fetched.get_status()}, callbacks {_callbacks(conn, job.id)}, exc:\n{exc}")
    assert fetched.return_value() == "the-result"
    assert job.id not in failed
    assert _callbacks(conn, job.id) == ["success:the-result"]
    assert _runs(conn, job.id) == ["start", "done"]
    core = belayq_rq.Queue("q1", connection=conn).belayq()
    assert core.stats()["in_flight"] == 0, core.stats()

    # The same worker process goes on: a second job finishes there, and the first one does
    # not run again.
    second = q.enqueue(rq_jobs.add, 2, 3)
    wait_for(lambda: Job.fetch(second.id, connection=conn).get_status() == JobStatus.FINISHED,
             60, f"the second job\n{w.text()[-3000:]}", step=0.1)
    assert Job.fetch(second.id, connection=conn).return_value() == 5
    assert Job.fetch(second.id, connection=conn).worker_name == fetched.worker_name
    assert w.alive(), w.text()[-3000:]
    assert _runs(conn, job.id) == ["start", "done"]
    assert _callbacks(conn, job.id) == ["success:the-result"]


# -- (c3) Celery ---------------------------------------------------------------------------


def _celery_worker(procs: Callable[..., Proc], env: dict[str, str], pool: str) -> Proc:
    cmd = [sys.executable, "-m", "celery", "-A", "tests.events.crash_app", "worker",
           "-n", f"flush-{uuid.uuid4().hex[:6]}@%h", "-l", "info", "-P", pool, "-c", "2",
           "--without-mingle", "--without-gossip", "--without-heartbeat"]
    return procs(cmd, env)


def _core_stats(port: int, name: str) -> dict[str, int]:
    """The core's stats of kombu queue ``name``, read as belayq_kombu's Channel.queue()
    builds it (kombu's priority lists are its ready lists)."""
    levels = [name] + [f"{name}\x06\x16{s}" for s in STEPS[1:]]
    core = ReliableQueue(redis.Redis(port=port), name, ready_key=levels[0],
                         level_keys=levels[1:], priority_steps=STEPS, payload_in_list=True,
                         keeper=False)
    return core.stats()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_celery_task_that_flushes_the_script_cache_is_acked_once(
    conn: redis.Redis, server: RedisServer, procs: Callable[..., Proc], pool: str
) -> None:
    from tests.events import crash_app

    lease_s = 3.0
    queue, tag = f"flush-{uuid.uuid4().hex[:8]}", f"ev-{uuid.uuid4().hex[:8]}"
    broker, backend = f"belayq://127.0.0.1:{server.port}/0", f"redis://127.0.0.1:{server.port}/1"
    env = child_env(CRASH_BROKER=broker, CRASH_BACKEND=backend, CRASH_QUEUE=queue,
                    CRASH_TAG=tag, CRASH_LEASE=str(lease_s))
    w = _celery_worker(procs, env, pool)
    wait_for(lambda: " ready." in w.text() or not w.alive(), 60, "the worker to start")
    assert w.alive(), w.text()[-3000:]
    app = crash_app.make_app(broker, backend, queue, lease_s=lease_s)

    def events(ev: str) -> list[int]:
        return [int(x.split(b":")[0]) for x in conn.lrange(f"{tag}:{ev}", 0, -1)]

    result = app.send_task("crash.flush_scripts", args=(1,))
    assert result.get(timeout=60) == "flushed-1"
    wait_for(lambda: _core_stats(server.port, queue)["in_flight"] == 0, 30,
             f"the ack (stats {_core_stats(server.port, queue)})\n{w.text()[-3000:]}")
    acked_at = time.monotonic()
    stats = _core_stats(server.port, queue)
    assert stats["acked"] == 1 and stats.get("stale_acks", 0) == 0, stats

    # Nothing runs it again within two leases (plus a sweep), and the worker consumes on.
    follow = app.send_task("crash.flush_scripts", args=(2,))
    assert follow.get(timeout=60) == "flushed-2"
    app.send_task("crash.work", args=(3, 0.1))
    wait_for(lambda: 3 in events("done"), 60, f"the next task\n{w.text()[-3000:]}")
    time.sleep(max(0.0, 2 * lease_s + 1 - (time.monotonic() - acked_at)))
    assert sorted(events("start")) == [1, 2, 3], w.text()[-3000:]
    assert sorted(events("done")) == [1, 2, 3]
    stats = _core_stats(server.port, queue)
    assert (stats["in_flight"], stats["ready"], stats["acked"]) == (0, 0, 3), stats
    assert stats.get("reclaimed", 0) == 0 and stats.get("stale_acks", 0) == 0, stats
    assert w.alive(), w.text()[-3000:]
    app.close()
