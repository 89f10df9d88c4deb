"""Real ``rq worker`` subprocesses on a paused queue: nothing is dequeued while jobs are
enqueued (one queue, and a worker of two queues whose claims go through claim_any), the
running job keeps its lease past it and finishes once, the claim names the worker's host
and pid, and a resume starts the queued jobs at once."""

from __future__ import annotations

import socket
import time

import pytest
import redis
import rq
from rq.job import Job, JobStatus

import belayq_rq
from belayq.cli import main
from tests.plugins.rq import jobs
from tests.plugins.rq.conftest import Workers
from tests.support import wait_for

FAST = "tests.plugins.rq.jobs.FastWorker"


def status(conn: redis.Redis, job_id: str) -> JobStatus:
    return Job.fetch(job_id, connection=conn).get_status()


def runs(conn: redis.Redis, job_id: str) -> list[str]:
    return [r.decode().split(":")[0] for r in conn.lrange(f"runs:{job_id}", 0, -1)]


@pytest.mark.parametrize("queues", [("q1",), ("high", "q1")], ids=["one-queue", "two-queues"])
def test_a_paused_queue_hands_an_rq_worker_nothing_until_resumed(
    conn: redis.Redis, workers: Workers, rq_url: str, queues: tuple[str, ...]
) -> None:
    w = workers.start(*queues, worker_class=FAST)
    q1 = rq.Queue("q1", connection=conn)
    seconds = 2 * jobs.SHORT_LEASE_MS / 1000 + 1  # outlives two leases: the keeper extends
    long_job = q1.enqueue(jobs.sleeper, seconds)
    wait_for(lambda: runs(conn, long_job.id), 30, "the long job to start")
    core = belayq_rq.Queue("q1", connection=conn).belayq()
    [lease] = core.in_flight()
    assert (lease.host, lease.pid) == (socket.gethostname(), w.pid), lease
    assert core.holders() == {f"{socket.gethostname()}:{w.pid}": 1}

    assert main(["pause", "--url", rq_url, "q1", "--kind", "rq"]) == 0
    waiting = [q1.enqueue(jobs.record, str(i)) for i in range(3)]  # enqueueing goes on
    wait_for(lambda: status(conn, long_job.id) == JobStatus.FINISHED, 60,
             "the long job to finish")
    time.sleep(jobs.SHORT_LEASE_MS / 1000 + 1)
    assert [status(conn, j.id) for j in waiting] == [JobStatus.QUEUED] * 3, workers.logs()
    assert runs(conn, long_job.id) == ["start", "done"]  # extended, never run twice
    stats = core.stats()
    assert stats["paused"] == 1 and stats["ready"] == 3 and stats["in_flight"] == 0, stats

    resumed = time.monotonic()
    assert main(["resume", "--url", rq_url, "q1", "--kind", "rq"]) == 0
    wait_for(lambda: all(status(conn, j.id) == JobStatus.FINISHED for j in waiting), 30,
             "the queued jobs to run")
    took = time.monotonic() - resumed
    print(f"\nrq worker {queues}: the queued jobs finished {took:.2f} s after the resume")
    assert took < 8, took  # generous: a shared 2-core box; the blocked claim is woken
