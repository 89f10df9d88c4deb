"""belayq_rq in-process: stock producers, RQ features, every settle path, class plumbing,
and the belayq equivalents of the RQ tests that pin its intermediate-list mechanics."""

from __future__ import annotations

import inspect
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest import mock

import pytest
import redis
import rq
import rq.worker
from rq import Callback, Retry
from rq.exceptions import DequeueTimeout
from rq.job import JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry

import belayq_rq
from belayq_rq.claims import claim_of
from tests.plugins.rq import jobs
from tests.support import wait_for


def in_flight(conn: Any, name: str) -> tuple[int, int]:
    """(messages out of the ready list, leases held): claimed, or landing after a BLMOVE."""
    s = belayq_rq.Queue(name, connection=conn).belayq().stats()
    return s["in_flight"] + s["landing"] - _provisional(conn, s), s["in_flight"]


def _provisional(conn: Any, s: dict[str, int]) -> int:
    # A landing entry the sweep gave a provisional lease is counted once, not twice.
    return min(s["landing"], s.get("orphans_found", 0) - s.get("adopted", 0))


def drain(conn: Any, *names: str, worker: type[rq.worker.BaseWorker] = belayq_rq.SimpleWorker,
          **work: Any) -> None:
    worker(list(names), connection=conn).work(burst=True, logging_level="WARNING", **work)


# -- stock producers, RQ features --------------------------------------------------------


def test_stock_producers_fifo_and_at_front(conn: redis.Redis) -> None:
    q = rq.Queue("q", connection=conn)
    for i in range(3):
        q.enqueue(jobs.append_to, "order", f"e{i}")
    q.enqueue_many([rq.Queue.prepare_data(jobs.append_to, ("order", f"m{i}")) for i in range(2)])
    q.enqueue(jobs.append_to, "order", "front", at_front=True)
    drain(conn, "q")
    order = [v.decode() for v in conn.lrange("order", 0, -1)]
    assert order == ["front", "e0", "e1", "e2", "m0", "m1"]
    assert in_flight(conn, "q") == (0, 0)


def test_success_failure_results_callbacks(conn: redis.Redis) -> None:
    q = rq.Queue("q", connection=conn)
    ok = q.enqueue(jobs.add, 2, 3, on_success=Callback(jobs.on_success_cb))
    bad = q.enqueue(jobs.fail, on_failure=Callback(jobs.on_failure_cb))
    drain(conn, "q")
    assert ok.get_status() == JobStatus.FINISHED and ok.return_value() == 5
    assert bad.get_status() == JobStatus.FAILED
    assert bad.id in FailedJobRegistry("q", connection=conn)
    assert conn.lrange(f"callbacks:{ok.id}", 0, -1) == [b"success:5"]
    assert conn.lrange(f"callbacks:{bad.id}", 0, -1) == [b"failure:ValueError"]
    assert in_flight(conn, "q") == (0, 0)


@pytest.mark.parametrize("worker", [belayq_rq.SimpleWorker, belayq_rq.Worker])
def test_retry_and_max_retries_ack_every_attempt(conn: redis.Redis, worker: Any) -> None:
    q = rq.Queue("q", connection=conn)
    job = q.enqueue(jobs.fail, retry=Retry(max=2))
    drain(conn, "q", worker=worker)
    assert job.get_status() == JobStatus.FAILED
    assert conn.llen(f"runs:{job.id}") == 3  # the first run and 2 retries
    stats = belayq_rq.Queue("q", connection=conn).belayq().stats()
    assert (stats["in_flight"], stats["claimed"], stats["acked"]) == (0, 3, 3), stats


def test_retry_with_interval_goes_through_the_scheduler(conn: redis.Redis) -> None:
    q = rq.Queue("q", connection=conn)
    job = q.enqueue(jobs.fail, retry=Retry(max=1, interval=1))
    drain(conn, "q")
    assert job.get_status() == JobStatus.SCHEDULED and in_flight(conn, "q") == (0, 0)
    time.sleep(1.1)
    drain(conn, "q", with_scheduler=True)
    assert job.get_status() == JobStatus.FAILED and conn.llen(f"runs:{job.id}") == 2


def test_enqueue_at_dependencies_unique_and_requeue(conn: redis.Redis) -> None:
    q = rq.Queue("q", connection=conn)
    at = q.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), jobs.add, 1, 1)
    parent = q.enqueue(jobs.add, 1, 2)
    child = q.enqueue(jobs.add, 3, 4, depends_on=parent)
    # unique=True came with rq 2.8; older ones would pass it to the job as a kwarg.
    unique = {"unique": True} if "unique" in inspect.signature(q.enqueue_call).parameters else {}
    uniq = q.enqueue(jobs.add, 5, 5, job_id="only-once", **unique)
    failed = q.enqueue(jobs.fail)
    drain(conn, "q", with_scheduler=True)
    assert [j.get_status() for j in (at, parent, child, uniq)] == [JobStatus.FINISHED] * 4
    assert failed.get_status() == JobStatus.FAILED
    FailedJobRegistry("q", connection=conn).requeue(failed.id)  # what `rq requeue` does
    drain(conn, "q")
    assert conn.llen(f"runs:{failed.id}") == 2
    assert in_flight(conn, "q") == (0, 0)


def test_group_and_cancel(conn: redis.Redis) -> None:
    from rq.group import Group

    q = rq.Queue("q", connection=conn)
    group = Group.create(connection=conn)
    group_jobs = group.enqueue_many(q, [rq.Queue.prepare_data(jobs.add, (i, 1)) for i in range(3)])
    canceled = q.enqueue(jobs.add, 9, 9)
    canceled.cancel()
    drain(conn, "q")
    assert [j.get_status() for j in group_jobs] == [JobStatus.FINISHED] * 3
    assert canceled.get_status() == JobStatus.CANCELED
    assert in_flight(conn, "q") == (0, 0)


def test_fakeredis_simple_worker_burst() -> None:
    import fakeredis

    conn = fakeredis.FakeRedis()
    q = belayq_rq.Queue("q", connection=conn)
    js = [q.enqueue(jobs.add, i, i) for i in range(3)] + [q.enqueue(jobs.fail)]
    belayq_rq.SimpleWorker([q], connection=conn).work(burst=True)
    assert [j.get_status() for j in js] == [JobStatus.FINISHED] * 3 + [JobStatus.FAILED]
    assert [j.return_value() for j in js[:3]] == [0, 2, 4]
    assert q.belayq().stats()["in_flight"] == 0


def test_round_trips_per_job_fewer_than_stock(conn: redis.Redis) -> None:
    """The claim script replaces RQ's move, the ack rides in RQ's own transaction, and RQ's
    repeated heartbeats and state writes are sent once."""
    from redis.connection import Connection

    def trips(worker: Any, queue_class: Any) -> float:
        conn.flushall()
        q = queue_class("q", connection=conn)
        drain(conn, "q", worker=worker)  # warm up: scripts loaded, queue built
        n = 20
        for i in range(n):
            q.enqueue(jobs.add, i, 1)
        main = threading.get_ident()
        count = [0]
        original = Connection.send_packed_command

        def counting(self: Any, *a: Any, **kw: Any) -> Any:
            if threading.get_ident() == main:
                count[0] += 1
            return original(self, *a, **kw)

        # patch.object puts the class back as it was: assigning the inherited method back
        # would leave a copy on Connection that hides any later patch of its base class
        with mock.patch.object(Connection, "send_packed_command", counting):
            w = worker(["q"], connection=conn)
            w.work(burst=True, logging_level="WARNING")
        return count[0] / n

    stock = trips(rq.worker.SimpleWorker, rq.Queue)
    ours = trips(belayq_rq.SimpleWorker, belayq_rq.Queue)
    print(f"\nround trips per job (SimpleWorker, incl. start/stop over 20 jobs): "
          f"stock {stock:.2f}, belayq {ours:.2f}")
    assert ours <= stock - 4  # 19 -> 14: the repeats dropped


# -- dequeue_any: RQ's contract ------------------------------------------------------------


def test_dequeue_any_contract(conn: redis.Redis) -> None:
    high = belayq_rq.Queue("high", connection=conn)
    low = belayq_rq.Queue("low", connection=conn)
    assert belayq_rq.Queue.dequeue_any([high, low], None, connection=conn) is None
    with pytest.raises(ValueError):
        belayq_rq.Queue.dequeue_any([high, low], 0, connection=conn)
    t0 = time.monotonic()
    with pytest.raises(DequeueTimeout):
        belayq_rq.Queue.dequeue_any([high, low], 1, connection=conn)
    assert time.monotonic() - t0 >= 0.9
    j_low = low.enqueue(jobs.add, 1, 1)
    j_high = high.enqueue(jobs.add, 2, 2)
    job, queue = belayq_rq.Queue.dequeue_any([high, low], None, connection=conn)
    assert (job.id, queue.name, type(queue)) == (j_high.id, "high", belayq_rq.Queue)
    job, queue = belayq_rq.Queue.dequeue_any([high, low], 5, connection=conn)
    assert (job.id, queue.name) == (j_low.id, "low")


def test_dequeue_any_drops_jobs_whose_hash_is_gone(conn: redis.Redis) -> None:
    q = belayq_rq.Queue("q", connection=conn)
    gone = q.enqueue(jobs.add, 1, 1)
    kept = q.enqueue(jobs.add, 2, 2)
    conn.delete(gone.key)
    job, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    assert job.id == kept.id
    assert in_flight(conn, "q") == (1, 1)  # only the job handed out


def test_blocking_dequeue_wakes_on_enqueue_to_any_queue(conn: redis.Redis) -> None:
    qs = [belayq_rq.Queue(n, connection=conn) for n in ("a", "b", "c")]
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(
        belayq_rq.Queue.dequeue_any(qs, 10, connection=conn)))
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    job = rq.Queue("c", connection=conn).enqueue(jobs.add, 1, 1)
    t.join(10)
    waited = time.monotonic() - t0
    assert got and got[0][0].id == job.id and got[0][1].name == "c"
    print(f"\nidle pickup, 3 queues, job on the lowest: {waited * 1000:.1f} ms")
    assert waited < 2.0


# -- belayq equivalents of RQ's intermediate-list tests ------------------------------------
# RQ moves a dequeued id into `rq:queue:NAME:intermediate` and fails it if it is stuck there;
# belayq moves it into the core's processing list with a lease and redelivers it instead.


@pytest.mark.parametrize("names", [("q",), ("q", "other")])
def test_dequeued_job_is_in_flight_until_its_outcome_is_recorded(
    conn: redis.Redis, names: tuple[str, ...]
) -> None:
    """Equivalent of test_dequeue_any_reliable / test_intermediate_queue: with one queue or
    several, a dequeued id is never only in memory."""
    queues = [belayq_rq.Queue(n, connection=conn) for n in names]
    job = queues[0].enqueue(jobs.add, 1, 2)
    got, queue = belayq_rq.Queue.dequeue_any(queues, None, connection=conn)
    assert got.id == job.id and queues[0].job_ids == []
    assert in_flight(conn, "q") == (1, 1)
    w = belayq_rq.SimpleWorker(queues, connection=conn)
    w.prepare_execution(got)
    w.perform_job(got, queue)  # equivalent of test_prepare_job_execution_removes_key_...
    assert in_flight(conn, "q") == (0, 0) and got.get_status() == JobStatus.FINISHED


def test_claim_of_a_dead_consumer_comes_back_not_failed(conn: redis.Redis) -> None:
    """Equivalent of test_cleanup_intermediate_queue(_in_maintenance): RQ fails a job stuck
    in its intermediate list; belayq puts it back in the queue once the lease expires."""
    q = belayq_rq.Queue("q", connection=conn, lease_ms=300)
    job = q.enqueue(jobs.add, 1, 2)
    got, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    claim = claim_of(got)
    assert claim is not None
    claim.core.forget([claim.delivery])  # the consumer dies: nobody extends the lease
    time.sleep(0.4)
    belayq_rq.SimpleWorker([q], connection=conn).clean_registries()  # maintenance pass
    assert q.job_ids == [job.id] and job.get_status() == JobStatus.QUEUED
    assert job.id not in FailedJobRegistry("q", connection=conn)
    again, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    assert claim_of(again).delivery.deliveries == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("execution_hash", [True, False], ids=["with-execution", "bare-entry"])
def test_a_finished_job_with_a_late_started_record_stays_finished(
    conn: redis.Redis, execution_hash: bool
) -> None:
    """Seen in the 10,000-task chaos run: a job finished, and an expired record of it was
    back in StartedJobRegistry afterwards (a heartbeat re-sent by redis-py after a killed
    connection). RQ's own cleanup would fail the FINISHED job as abandoned."""
    q = belayq_rq.Queue("q", connection=conn)
    job = q.enqueue(jobs.add, 2, 3, on_failure=Callback(jobs.on_failure_cb))
    belayq_rq.SimpleWorker([q], connection=conn).work(burst=True)
    assert job.get_status() == JobStatus.FINISHED
    registry = StartedJobRegistry("q", connection=conn)
    if execution_hash:
        from rq.executions import Execution

        with conn.pipeline() as pipe:
            execution = Execution.create(job, ttl=60, pipeline=pipe)
            pipe.execute()
        assert execution.id in [e.id for e in job.get_executions()]
        composite = execution.composite_key
    else:
        composite = f"{job.id}:gone-execution"
    conn.zadd(registry.key, {composite: time.time() - 10})  # expired
    assert any(str(x).startswith(job.id) for x in registry.get_expired_job_ids())
    belayq_rq.SimpleWorker([q], connection=conn).clean_registries()
    assert job.get_status() == JobStatus.FINISHED and job.return_value() == 5
    assert job.id not in FailedJobRegistry("q", connection=conn)
    assert registry.get_expired_job_ids() == []
    assert conn.lrange(f"callbacks:{job.id}", 0, -1) == []  # no on_failure either


def test_live_claim_is_left_alone_by_sweep_and_maintenance(conn: redis.Redis) -> None:
    """Equivalent of test_no_cleanup_while_in_started_queue."""
    q = belayq_rq.Queue("q", connection=conn, lease_ms=300)
    q.enqueue(jobs.add, 1, 2)
    got, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    time.sleep(0.8)  # the lease keeper extends it meanwhile
    belayq_rq.SimpleWorker([q], connection=conn).clean_registries()
    assert q.job_ids == [] and in_flight(conn, "q") == (1, 1)
    claim_of(got).core.ack(claim_of(got).delivery)  # type: ignore[union-attr]


def test_lease_less_entry_of_a_consumer_that_died_mid_claim_is_adopted(conn: redis.Redis) -> None:
    """Equivalent of test_get_job_ids/cleanup of ids sitting in the intermediate list with no
    StartedJobRegistry entry: an id moved by a blocking claim whose process died before the
    lease was registered is adopted by the sweep and returned after one lease."""
    q = belayq_rq.Queue("q", connection=conn, lease_ms=300)
    job = q.enqueue(jobs.add, 1, 2)
    core = q.belayq()
    conn.execute_command(*core.blmove_command(1))  # the claimer dies right after this
    # In flight with no lease yet, unless the keeper's own sweep already gave it its
    # provisional one (it sweeps every second, and a loaded machine may get there first).
    assert q.job_ids == [] and in_flight(conn, "q")[0] == 1
    core.sweep()
    assert in_flight(conn, "q") == (1, 1)  # provisional lease
    time.sleep(0.4)
    core.sweep()
    assert q.job_ids == [job.id]


def test_late_outcome_of_a_lost_claim_does_not_settle_the_redelivery(conn: redis.Redis) -> None:
    """The ack in RQ's transaction is fenced: a worker whose lease lapsed cannot ack the job's
    next delivery."""
    q = belayq_rq.Queue("q", connection=conn, lease_ms=300)
    q.enqueue(jobs.add, 1, 2)
    old, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    old_claim = claim_of(old)
    old_claim.core.forget([old_claim.delivery])  # type: ignore[union-attr]
    time.sleep(0.4)
    new, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)  # swept back, claimed
    w = belayq_rq.SimpleWorker([q], connection=conn)
    with conn.pipeline() as pipe:
        w.cleanup_execution(old, pipe)  # the late worker records its outcome
        assert pipe.execute()[-1] == [0]  # the ack was refused
    stats = q.belayq().stats()
    assert (stats["in_flight"], stats["leased"], stats["stale_acks"]) == (1, 1, 1)
    with conn.pipeline() as pipe:
        w.cleanup_execution(new, pipe)
        assert pipe.execute()[-1] == [1]


def test_redelivery_removes_the_lost_attempts_started_entries(conn: redis.Redis) -> None:
    q = belayq_rq.Queue("q", connection=conn, lease_ms=300)
    job = q.enqueue(jobs.add, 1, 2)
    got, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    w = belayq_rq.SimpleWorker([q], connection=conn)
    w.prepare_execution(got)  # the attempt starts, then its worker dies
    claim_of(got).core.forget([claim_of(got).delivery])  # type: ignore[union-attr]
    registry = StartedJobRegistry("q", connection=conn)
    # (rq 2.0 lists "job_id:execution_id" here, later versions the job id)
    assert [i.split(":")[0] for i in registry.get_job_ids(cleanup=False)] == [job.id]
    time.sleep(0.4)
    belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    assert registry.get_job_ids(cleanup=False) == []
    registry.cleanup(timestamp=time.time() + 10**7)  # what `rq info` runs: nothing to fail
    assert job.id not in FailedJobRegistry("q", connection=conn)


def test_a_finished_job_is_not_failed_by_a_later_lost_attempt(conn: redis.Redis) -> None:
    """Attempt 1 is cut off (frozen) but finishes later; attempt 2 (started meanwhile) is
    lost; the worker that claims delivery 3 sees the job FINISHED and drops its copy, and
    with it attempt 2's StartedJobRegistry entry, which RQ's cleanup would otherwise turn
    into a FAILED AbandonedJobError (found by the chaos harness)."""
    q = belayq_rq.Queue("q", connection=conn, lease_ms=300)
    job = q.enqueue(jobs.add, 1, 2)
    w = belayq_rq.SimpleWorker([q], connection=conn)
    first, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    claim_of(first).core.forget([claim_of(first).delivery])  # type: ignore[union-attr]
    time.sleep(0.4)
    second, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    w.prepare_execution(second)  # attempt 2 starts ...
    claim_of(second).core.forget([claim_of(second).delivery])  # type: ignore[union-attr]
    job.set_status(JobStatus.FINISHED)  # ... while attempt 1 completes the job
    registry = StartedJobRegistry("q", connection=conn)
    assert registry.get_job_ids(cleanup=False)
    time.sleep(0.4)
    assert belayq_rq.Queue.dequeue_any([q], None, connection=conn) is None  # dropped
    assert registry.get_job_ids(cleanup=False) == []
    registry.cleanup(timestamp=time.time() + 10**7)
    assert job.get_status() == JobStatus.FINISHED
    assert job.id not in FailedJobRegistry("q", connection=conn)
    assert q.belayq().stats()["in_flight"] == 0


# -- class plumbing ------------------------------------------------------------------------


def test_worker_upgrades_the_stock_queue_class_the_cli_passes(conn: redis.Redis) -> None:
    stock = [rq.Queue("a", connection=conn), rq.Queue("b", connection=conn)]
    w = belayq_rq.Worker(stock, connection=conn, queue_class=rq.Queue)
    assert w.queue_class is belayq_rq.Queue
    assert [type(q) for q in w.queues] == [belayq_rq.Queue] * 2
    assert [q.name for q in w.queues] == ["a", "b"]
    w2 = jobs.FastWorker(["a"], connection=conn, queue_class="rq.queue.Queue")
    assert w2.queue_class is jobs.FastQueue and type(w2.queues[0]) is jobs.FastQueue


def test_worker_refuses_foreign_queue_classes_and_spawn(conn: redis.Redis) -> None:
    class OtherQueue(rq.Queue):
        pass

    with pytest.raises(TypeError, match=r"belayq_rq\.Queue"):
        belayq_rq.Worker(["a"], connection=conn, queue_class=OtherQueue)
    with pytest.raises(TypeError, match=r"belayq_rq\.Queue"):
        belayq_rq.Worker([OtherQueue("a", connection=conn)], connection=conn)

    spawn_worker = getattr(rq.worker, "SpawnWorker", None)  # rq >= 2.2
    if spawn_worker is not None:

        class Spawn(belayq_rq.Worker, spawn_worker):  # type: ignore[misc,valid-type]
            pass

        with pytest.raises(TypeError, match="SpawnWorker"):
            Spawn(["a"], connection=conn)


def test_stock_worker_with_belayq_queues_refuses_before_taking_a_job(
    conn: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    q = belayq_rq.Queue("q", connection=conn)
    job = q.enqueue(jobs.add, 1, 1)
    rq.worker.SimpleWorker([q], connection=conn).work(burst=True)
    assert "is not a belayq_rq worker" in caplog.text
    assert job.get_status() == JobStatus.QUEUED and q.job_ids == [job.id]
    with pytest.raises(TypeError, match="not a belayq_rq worker"):
        stock = rq.worker.SimpleWorker([q], connection=conn, queue_class=belayq_rq.Queue)
        stock.dequeue_job_and_maintain_ttl(None)


def test_a_claim_that_cannot_be_handed_back_is_retried_by_the_keeper(
    conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis goes away between the claim and loading the job: the adapter's hand-back goes
    to the core's retry_later (held and extended meanwhile), and a keeper beat lands it."""
    import belayq_rq.queue as rq_queue
    from belayq import ConnectionLost

    q = belayq_rq.Queue("q", connection=conn)
    job = q.enqueue(jobs.add, 1, 2)
    core = q.belayq()

    def away(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionLost("simulated outage")

    monkeypatch.setattr(rq_queue, "_load", away)
    real_nack = core.nack
    monkeypatch.setattr(core, "nack", away)
    with pytest.raises(redis.ConnectionError):
        belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    assert core.unsettled == 1 and len(core.held) == 1
    assert q.job_ids == []  # still claimed, not lost
    monkeypatch.setattr(core, "nack", real_nack)
    core.heartbeat()  # what the keeper's next beat does
    assert core.unsettled == 0 and core.held == []
    assert q.job_ids == [job.id]


def test_a_lost_attempt_whose_requeue_cannot_reach_redis_is_retried_and_the_worker_goes_on(
    conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost attempt (here marked so by hand, as a killed work horse would be) is handed
    back with a nack; when that cannot reach Redis, the core's keeper retries it instead of
    the error stopping the worker, and the job runs again once it lands."""
    from belayq import ConnectionLost

    q = belayq_rq.Queue("q", connection=conn)
    job = q.enqueue(jobs.fail)
    later = q.enqueue(jobs.add, 1, 2)
    core = q.belayq()
    real_nack = core.nack

    def away(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionLost("simulated outage")

    monkeypatch.setattr(core, "nack", away)
    w = belayq_rq.SimpleWorker([q], connection=conn)
    w._belayq_lost = job.id
    w.work(burst=True, logging_level="WARNING")
    assert later.get_status() == JobStatus.FINISHED  # the worker went on
    assert core.unsettled == 1 and job.get_status() != JobStatus.FAILED
    monkeypatch.setattr(core, "nack", real_nack)
    core.heartbeat()  # what the keeper's next beat does
    assert core.unsettled == 0
    assert q.job_ids == [job.id] and job.get_status() == JobStatus.QUEUED


def test_an_entry_whose_dead_letter_cannot_reach_redis_is_retried_and_the_next_job_runs(
    conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from belayq import ConnectionLost

    q = belayq_rq.Queue("q", connection=conn)
    gone = q.enqueue(jobs.add, 1, 1)
    kept = q.enqueue(jobs.add, 2, 2)
    conn.delete(gone.key)
    core = q.belayq()
    real = core.dead_letter

    def away(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionLost("simulated outage")

    monkeypatch.setattr(core, "dead_letter", away)
    job, _ = belayq_rq.Queue.dequeue_any([q], None, connection=conn)
    assert job.id == kept.id
    assert core.unsettled == 1
    monkeypatch.setattr(core, "dead_letter", real)
    core.heartbeat()
    assert core.unsettled == 0
    assert [d.id for d in core.dead_letters()] == [gone.id]


@pytest.mark.parametrize("worker_class", ["belayq_rq.SimpleWorker", "belayq_rq.Worker"])
def test_an_idle_worker_after_fast_jobs_keeps_rqs_own_heartbeat_ttl(
    conn: redis.Redis, workers: Any, worker_class: str
) -> None:
    """Around every job RQ sets the worker key's expiry to the job's TTL (about 90 s), then
    to its own (worker_ttl + 60 s) when the job ends. The repeats this worker skips must
    never leave the job's TTL as the last one: an idle worker would drop out of ``rq info``
    and the dashboards while it waits for work."""
    q = belayq_rq.Queue("ttl", connection=conn)
    workers.start("ttl", worker_class=worker_class, extra=("--worker-ttl", "420"))
    for round_ in range(3):
        js = [q.enqueue(jobs.add, i, 1) for i in range(5)]
        wait_for(lambda js=js: all(j.get_status() == JobStatus.FINISHED for j in js), 30,
                 what=lambda n=round_: f"round {n}: jobs finished\n{workers.logs()}")
        time.sleep(0.3)  # idle now: blocked in the claim
        [worker] = rq.Worker.all(connection=conn)  # what `rq info` lists
        assert worker.get_state() == "idle"
        ttl = conn.ttl(worker.key)
        assert 420 < ttl <= 480, f"worker key TTL {ttl} s after the jobs, RQ's own is 480"


def test_a_work_horse_connects_without_reading_package_metadata(
    conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py 7.1+ reads its version from its package metadata for each new connection of
    a client built from a URL, as RQ's CLI builds it (1.5-3 ms); a work horse makes one per
    job. The forking worker resolves it once."""
    import os

    import redis.utils

    real = redis.utils.get_lib_version

    def counted() -> str:
        jobs.LIB_VERSION_LOOKUPS.append(os.getpid())
        return real()

    monkeypatch.setattr(redis.utils, "get_lib_version", counted)
    kwargs = conn.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}"
    q = belayq_rq.Queue("q", connection=redis.Redis.from_url(url))
    js = [q.enqueue(jobs.lib_version_lookups_here) for _ in range(3)]
    belayq_rq.Worker(["q"], connection=redis.Redis.from_url(url)).work(
        burst=True, logging_level="WARNING"
    )
    assert [j.get_status() for j in js] == [JobStatus.FINISHED] * 3
    assert [j.return_value() for j in js] == [0, 0, 0]
    stock = rq.Queue("stock", connection=redis.Redis.from_url(url))
    j = stock.enqueue(jobs.lib_version_lookups_here)
    rq.worker.Worker(["stock"], connection=redis.Redis.from_url(url)).work(
        burst=True, logging_level="WARNING"
    )
    if _has_driver_info():  # redis-py 7.1+
        assert j.return_value() >= 1  # what it saves: a stock work horse reads it


def _has_driver_info() -> bool:
    try:
        import redis.driver_info  # noqa: F401
    except ImportError:
        return False
    return True
