"""Restart: the server is SIGKILLed and started again on the same port and directory.

Two persistence setups:

* ``aof``: ``--appendonly yes --appendfsync everysec``. A process kill keeps what reached
  the file (the page cache survives it): every write before the kill is back.
* ``rdb``: ``--appendonly no --save ""`` with a ``SAVE`` at the history's checkpoint (see
  ``servers.run_history``): every write after it is rolled back, among them message M
  nacked and claimed again (its token moved on) and the token sequence itself.

After the restart (the queue objects are the ones made before it; the script cache is
empty): tokens handed out never equal tokens handed out before; settles with pre-restart
tokens are refused, counted and change nothing; every message in Redis at the snapshot is
ready, in flight, delayed or dead exactly once; the first call of every kind works.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
import rq
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq.job import Job, JobStatus

import belayq_rq
from belayq import Delivery, ReliableQueue
from belayq.embedded import RedisServer
from tests.conftest import ON_BOTH
from tests.events import rq_jobs

from .servers import (
    LEASE_MS,
    LONG_LEASE_MS,
    History,
    aof_flushed,
    cached_scripts,
    check_nothing_lost,
    check_stale_refused,
    check_tokens_fresh,
    closing_all,
    empty_script_cache,
    kill9,
    make_queue,
    reclaim_all,
    recover_everything,
    restart,
    run_history,
)

pytestmark = pytest.mark.timeout(120)

MODES = {
    "aof": ("--appendonly", "yes", "--appendfsync", "everysec"),
    "rdb": ("--appendonly", "no", "--save", ""),
}


def persist(client: redis.Redis, mode: str) -> None:
    """Make the writes so far survive a SIGKILL: SAVE (rdb), or the AOF buffer written."""
    if mode == "rdb":
        client.save()
    else:
        aof_flushed(client)


def kill_and_restart(server: RedisServer, client: redis.Redis) -> None:
    kill9(server)
    restart(server)
    # Redis 7 keeps no scripts across a restart (older versions replay SCRIPT LOAD from
    # the AOF; then the cache is emptied here, to test the same state).
    empty_script_cache(client)
    assert cached_scripts(client) == 0


@dataclass
class Restarted:
    history: History
    queue: ReliableQueue  # made before the restart


@pytest.fixture(params=sorted(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def restarted(
    start_server: Callable[..., RedisServer], qname: str, mode: str
) -> Iterator[Callable[[], Restarted]]:
    opened: list[object] = []

    def run() -> Restarted:
        server = start_server(*MODES[mode])
        writer_client, after_client = redis.Redis(port=server.port), redis.Redis(port=server.port)
        opened.extend((writer_client, after_client))
        writer = make_queue(writer_client, qname, lease_ms=LEASE_MS)
        after = make_queue(after_client, qname, lease_ms=LONG_LEASE_MS)

        def checkpoint() -> None:
            if mode == "rdb":
                writer_client.save()

        history = run_history(writer, checkpoint, lost_writes=mode == "rdb")
        if mode == "aof":
            aof_flushed(writer_client)
        # The admin calls go through the writer's client, so the queue's first call after
        # the restart meets its pooled connection dead.
        kill_and_restart(server, writer_client)
        return Restarted(history, after)

    with closing_all(opened):
        yield run


def test_no_token_repeats_after_restart(restarted: Callable[[], Restarted]) -> None:
    r = restarted()
    q, h = r.queue, r.history
    got = recover_everything(q, h)
    check_tokens_fresh(h, got)


@ON_BOTH
def test_stale_settles_after_restart_are_refused(restarted: Callable[[], Restarted]) -> None:
    r = restarted()
    q, h = r.queue, r.history
    got = recover_everything(q, h)
    check_stale_refused(q, h, got)


@ON_BOTH
def test_first_calls_after_restart_work(
    start_server: Callable[..., RedisServer], qname: str, mode: str
) -> None:
    """A restart before each kind of call: every one finds the script cache empty."""
    server = start_server(*MODES[mode])
    client, admin = redis.Redis(port=server.port), redis.Redis(port=server.port)
    with closing_all([client, admin]):
        q = make_queue(client, qname, lease_ms=LONG_LEASE_MS)
        present = set(q.publish_many([f"r{i}" for i in range(8)]))
        dead: set[str] = set()
        held: list[Delivery] = []

        def claim(n: int) -> list[Delivery]:
            got = q.claim(timeout=5, count=n)
            assert len(got) == n
            return got

        def ack() -> None:
            d = held.pop()
            assert q.ack(d)
            present.discard(d.id)

        def ack_and_claim() -> None:
            d = held.pop()
            acked, got = q.ack_and_claim([d], count=1)
            assert acked == [True] and len(got) == 1
            present.discard(d.id)
            held.extend(got)

        def bury() -> None:
            d = held.pop()
            assert q.dead_letter(d, "buried after a restart")
            dead.add(d.id)

        steps: list[tuple[str, Callable[[], object]]] = [
            ("stats", lambda: q.stats()["ready"] == 8 or pytest.fail("stats")),
            ("publish", lambda: present.add(q.publish("after a restart"))),
            ("publish_many", lambda: present.update(q.publish_many(["m1", "m2"]))),
            ("claim", lambda: held.extend(claim(4))),
            ("ack", ack),
            ("ack_and_claim", ack_and_claim),
            ("nack", lambda: q.nack(held.pop(), delay_ms=0) == "ready" or pytest.fail("nack")),
            ("extend", lambda: q.extend(held) == [True] * len(held) or pytest.fail("extend")),
            ("release", lambda: q.release([held.pop()]) == 1 or pytest.fail("release")),
            ("sweep", lambda: q.sweep().ran or pytest.fail("sweep")),
            ("dead_letter", bury),
            ("dead_letters", lambda: {d.id for d in q.dead_letters()} == dead or pytest.fail()),
            ("claim again", lambda: held.extend(claim(1))),
        ]
        for what, call in steps:
            persist(admin, mode)
            kill_and_restart(server, admin)
            try:
                call()
            except Exception as exc:
                raise AssertionError(f"the first call after a restart, {what}, failed") from exc
        persist(admin, mode)
        kill_and_restart(server, admin)
        h = History(present=present, dead=dead, lost_writes=False)
        got = reclaim_all(q, h, held)
        check_nothing_lost(q, h, got)
        assert q.ack_many(got) == [True] * len(got)


class _RestartingWorker(belayq_rq.SimpleWorker):
    """Kills the server (AOF always) just before RQ records the start of its first job,
    and starts it again 1.5 s later."""

    server: RedisServer

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        if not getattr(self, "_restarted", False):
            self._restarted = True
            kill9(self.server)
            threading.Timer(1.5, restart, (self.server,)).start()
        super().prepare_job_execution(job, remove_from_intermediate_queue)


def test_rq_job_whose_start_meets_a_restart_finishes(
    start_server: Callable[..., RedisServer],
) -> None:
    """RQ's records of the start fail with ConnectionError while the server restarts: the
    job has not started, so it must not be FAILED (nor its on_failure run); it runs once.

    The client retries once, at once, as redis-py 5 did (redis-py 8 retries for about 5 s
    by itself, which would hide this outage)."""
    server = start_server("--appendonly", "yes", "--appendfsync", "always")
    conn = redis.Redis(port=server.port, retry=Retry(NoBackoff(), 1))
    with closing_all([conn]):
        q = belayq_rq.Queue("restarts", connection=conn)
        job = q.enqueue(rq_jobs.add, 2, 3, on_failure=rq.Callback(rq_jobs.on_failure))
        worker = _RestartingWorker([q], connection=conn)
        worker.server = server
        worker.work(burst=True)
        job.refresh()
        assert job.get_status() == JobStatus.FINISHED, job.latest_result()
        assert job.return_value() == 5
        runs = [r.decode().split(":")[0] for r in conn.lrange(f"runs:{job.id}", 0, -1)]
        assert runs == ["start", "done"]
        assert conn.lrange(f"callbacks:{job.id}", 0, -1) == []
        assert q.belayq().stats()["in_flight"] == 0
