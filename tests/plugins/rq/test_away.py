"""RQ's start-up writes while the server is away (``belayq_rq.away``): a worker waits for the
server up to its ttl and then exits with a clear message; its own birth whose reply was lost
is not refused as "another active worker"; a dequeue that times out is retried by RQ's loop
instead of stopping the worker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
import rq.worker
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq.job import Job, JobStatus

import belayq_rq
from belayq.embedded import RedisServer, free_port
from belayq_rq.worker import BelayqWorkerMixin
from tests.conftest import any_binary

from . import jobs


class _LoseTheBirthReply(rq.worker.SimpleWorker):
    """RQ's ``register_birth`` whose first call commits and then loses its reply."""

    lost = False

    def register_birth(self) -> None:
        super().register_birth()  # type: ignore[no-untyped-call]
        if not self.lost:
            self.lost = True
            raise redis.ConnectionError("Connection reset by peer (the reply was lost)")


class BirthReplyLostWorker(BelayqWorkerMixin, _LoseTheBirthReply):
    queue_class = jobs.FastQueue


def test_a_start_that_never_finds_the_server_ends_with_a_clear_message() -> None:
    conn = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match=r"away for 1 s \(the worker's ttl\)"):
        belayq_rq.SimpleWorker(["q"], connection=conn, worker_ttl=1)
    assert time.monotonic() - started >= 0.5, "gave up without waiting"


def test_a_worker_whose_server_is_away_at_its_start_waits_for_it(qname: str) -> None:
    """Built while the server is up, started (``work``) while it is away: RQ's birth and
    command channel wait for it, the scheduler starts after them, and the worker works."""
    server = RedisServer(any_binary()).start()
    port = server.port
    # No retries of redis-py's own: the server is away for longer than they last.
    conn = redis.Redis(port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    again: list[RedisServer] = []
    queue = jobs.FastQueue(qname, connection=conn)
    worker = jobs.FastSimpleWorker([queue], connection=conn)
    server.stop()

    def come_back() -> None:
        time.sleep(1.5)
        again.append(RedisServer(any_binary(), port=port).start())
        queue.enqueue(jobs.add, 1, 2, job_id="after-the-restart")

    back = threading.Thread(target=come_back)
    back.start()
    try:
        assert worker.work(max_jobs=1, with_scheduler=True)
        back.join()
        job = Job.fetch("after-the-restart", connection=conn)
        assert job.get_status() == JobStatus.FINISHED
    finally:
        back.join()
        conn.close()
        for s in again:
            s.stop()


def test_its_own_birth_with_a_lost_reply_is_no_other_active_worker(
    conn: redis.Redis, qname: str
) -> None:
    queue = jobs.FastQueue(qname, connection=conn)
    job = queue.enqueue(jobs.add, 1, 2)
    worker = BirthReplyLostWorker([queue], connection=conn)
    assert worker.work(burst=True)
    assert worker.lost
    assert Job.fetch(job.id, connection=conn).get_status() == JobStatus.FINISHED


def test_a_dequeue_that_times_out_is_retried_by_rqs_loop(
    conn: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = jobs.FastQueue(qname, connection=conn)
    job = queue.enqueue(jobs.add, 1, 2)
    fetch = Job.fetch.__func__  # type: ignore[attr-defined]
    calls = []

    def slow_once(cls: type[Job], *args: Any, **kwargs: Any) -> Job:
        calls.append(1)
        if len(calls) == 1:
            raise redis.TimeoutError("Timeout reading from socket (a frozen primary)")
        return fetch(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(Job, "fetch", classmethod(slow_once))
    worker = jobs.FastSimpleWorker([queue], connection=conn)
    # Not a burst: RQ's burst dequeue does not retry; the worker stops after one job.
    worker.work(max_jobs=1)
    assert len(calls) >= 2
    assert Job.fetch(job.id, connection=conn).get_status() == JobStatus.FINISHED


@pytest.mark.parametrize("worker_class", [belayq_rq.SimpleWorker, belayq_rq.Worker])
def test_rqs_bookkeeping_of_a_running_worker_is_skipped_while_the_server_is_away(
    worker_class: Any,
) -> None:
    """A worker's own heartbeats and state writes (sent once where RQ repeats them) meet a
    server that went away: each is skipped, none stops the worker."""
    server = RedisServer(any_binary()).start()
    conn = redis.Redis(port=server.port, socket_connect_timeout=0.3,
                       retry=Retry(NoBackoff(), 0))
    worker = worker_class(["q"], connection=conn)
    worker.heartbeat()
    worker.set_state("idle")
    server.stop()
    time.sleep(0.15)  # past the repeat window: both are sent again, to nothing
    worker.heartbeat()
    worker.heartbeat(90)
    worker.set_state("busy")
    worker.set_state("idle")
