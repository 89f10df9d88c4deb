"""Real ``rq worker`` subprocesses killed mid-job (docs/design.md §8 "Real workers").

Stock RQ turns each of these crashes into a FAILED job (AbandonedJobError, about 10 min
later, or at once for a killed work horse). With belayq_rq the job runs again on another
worker, counted as a delivery. Recovery times are printed (``pytest -s``), not asserted
tightly: other work shares this machine.

Most tests use ``jobs.FastWorker`` (lease 2 s, max_deliveries 3) so they take seconds; one
uses ``belayq_rq.Worker`` with its defaults to show the default recovery time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import redis
import rq
from rq.job import Dependency, Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry

import belayq_rq
from tests.plugins.rq import jobs
from tests.plugins.rq.conftest import Workers
from tests.support import wait_for

FAST = "tests.plugins.rq.jobs.FastWorker"
FAST_SIMPLE = "tests.plugins.rq.jobs.FastSimpleWorker"


def runs(conn: redis.Redis, job_id: str) -> list[tuple[str, int, float]]:
    out = []
    for raw in conn.lrange(f"runs:{job_id}", 0, -1):
        event, pid, t = raw.decode().split(":")
        out.append((event, int(pid), float(t)))
    return out


def started(conn: redis.Redis, job_id: str, n: int = 1) -> list[tuple[str, int, float]]:
    """The job's first ``n`` starts, or [] while it has started fewer times."""
    starts = [r for r in runs(conn, job_id) if r[0] == "start"]
    return starts[:n] if len(starts) >= n else []


def kill9(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def status(conn: redis.Redis, job_id: str) -> JobStatus:
    return Job.fetch(job_id, connection=conn).get_status()


def assert_settled_cleanly(conn: redis.Redis, queue: str, job_id: str) -> None:
    """Nothing left in flight, and RQ's own abandoned-job cleanup (what `rq info` runs)
    finds nothing to fail, even when every started entry looks expired."""
    core = belayq_rq.Queue(queue, connection=conn).belayq()
    stats = core.stats()
    assert stats["in_flight"] == 0 and stats["leased"] == 0, stats
    StartedJobRegistry(queue, connection=conn).cleanup(timestamp=time.time() + 10**7)
    assert status(conn, job_id) == JobStatus.FINISHED
    assert job_id not in FailedJobRegistry(queue, connection=conn).get_job_ids()


@pytest.mark.parametrize("queues", [("q1",), ("high", "q1")], ids=["one-queue", "two-queues"])
@pytest.mark.parametrize("worker_class", [FAST, FAST_SIMPLE], ids=["Worker", "SimpleWorker"])
def test_kill9_of_worker_and_horse_runs_the_job_on_another_worker(
    conn: redis.Redis, workers: Workers, queues: tuple[str, ...], worker_class: str
) -> None:
    kill9_worker_and_horse(conn, workers, queues, worker_class)


@pytest.mark.servers("valkey")
def test_kill9_of_worker_and_horse_on_valkey(
    conn: redis.Redis, workers: Workers, server_kind: str
) -> None:
    """The same on Valkey 9.1 (one representative; every test here runs on Valkey with
    ``--all-servers``)."""
    assert conn.info("server")["server_name"] == "valkey"
    kill9_worker_and_horse(conn, workers, ("high", "q1"), FAST)


def kill9_worker_and_horse(
    conn: redis.Redis, workers: Workers, queues: tuple[str, ...], worker_class: str
) -> None:
    w1 = workers.start(*queues, worker_class=worker_class)
    job = rq.Queue("q1", connection=conn).enqueue(jobs.sleeper, 2.5)
    (_, horse, _), = wait_for(lambda: started(conn, job.id), 30, "the first attempt to start")
    kill9(w1.pid, horse)
    killed_at = time.time()
    w1.wait(10)
    workers.start(*queues, worker_class=worker_class)
    wait_for(lambda: started(conn, job.id, 2), 30, "the job to start again")
    wait_for(lambda: status(conn, job.id) == JobStatus.FINISHED, 30, "the job to finish")
    second_start = started(conn, job.id, 2)[1][2]
    print(
        f"\n[{worker_class.rsplit('.', 1)[1]}, {len(queues)} queue(s), lease 2 s] kill -9 of "
        f"worker and horse -> job started again after {second_start - killed_at:.2f} s"
    )
    events = [e for e, _, _ in runs(conn, job.id)]
    assert events == ["start", "start", "done"], workers.logs()
    assert_settled_cleanly(conn, "q1", job.id)


def test_default_lease_recovers_within_30_s(conn: redis.Redis, workers: Workers) -> None:
    """`rq worker -w belayq_rq.Worker`, nothing else configured (RQ's CLI passes its stock
    Queue class; the worker upgrades it)."""
    w1 = workers.start("default", worker_class="belayq_rq.Worker")
    job = rq.Queue("default", connection=conn).enqueue(jobs.sleeper, 2.0)
    (_, horse, _), = wait_for(lambda: started(conn, job.id), 30, "the first attempt to start")
    assert horse != w1.pid, "the forking worker runs the job in a work horse"
    kill9(w1.pid, horse)
    killed_at = time.time()
    workers.start("default", worker_class="belayq_rq.Worker")
    wait_for(lambda: started(conn, job.id, 2), 45, "the job to start again", step=0.1)
    recovery = started(conn, job.id, 2)[1][2] - killed_at
    wait_for(lambda: status(conn, job.id) == JobStatus.FINISHED, 30, "the job to finish")
    print(f"\n[belayq_rq.Worker defaults: lease 20 s] kill -9 -> job running again after "
          f"{recovery:.2f} s (stock RQ: FAILED AbandonedJobError after ~800 s)")
    assert recovery < 30, workers.logs()
    assert_settled_cleanly(conn, "default", job.id)


@pytest.mark.parametrize("queues", [("q1",), ("high", "q1")], ids=["one-queue", "two-queues"])
def test_horse_killed_while_the_worker_lives_is_redelivered(
    conn: redis.Redis, workers: Workers, queues: tuple[str, ...]
) -> None:
    w1 = workers.start(*queues, worker_class=FAST)
    job = rq.Queue("q1", connection=conn).enqueue(jobs.sleeper, 1.5)
    (_, horse, _), = wait_for(lambda: started(conn, job.id), 30, "the first attempt to start")
    kill9(horse)  # as the OOM killer would
    killed_at = time.time()
    wait_for(lambda: started(conn, job.id, 2), 30, "the job to start again")
    wait_for(lambda: status(conn, job.id) == JobStatus.FINISHED, 30, "the job to finish")
    print(f"\n[Worker, {len(queues)} queue(s)] horse SIGKILL -> job started again after "
          f"{started(conn, job.id, 2)[1][2] - killed_at:.3f} s (stock RQ: FAILED at once)")
    assert [e for e, _, _ in runs(conn, job.id)] == ["start", "start", "done"]
    assert w1.poll() is None
    assert_settled_cleanly(conn, "q1", job.id)


def test_job_that_kills_its_horse_every_time_fails_after_max_deliveries(
    conn: redis.Redis, workers: Workers
) -> None:
    workers.start("q1", worker_class=FAST)
    q = rq.Queue("q1", connection=conn)
    job = q.enqueue(jobs.kill_my_horse)
    after = q.enqueue(jobs.add, 1, 1, depends_on=Dependency(jobs=[job], allow_failure=True))
    wait_for(lambda: status(conn, job.id) == JobStatus.FAILED, 60, "the job to fail")
    wait_for(lambda: status(conn, after.id) == JobStatus.FINISHED, 30, "its dependent to run")
    assert len(runs(conn, job.id)) == jobs.MAX_DELIVERIES
    assert job.id in FailedJobRegistry("q1", connection=conn).get_job_ids()
    reason = Job.fetch(job.id, connection=conn).latest_result().exc_string
    print(f"\nFailedJobRegistry reason: {reason}")
    assert f"max_deliveries={jobs.MAX_DELIVERIES}" in reason
    assert "Work-horse terminated unexpectedly" in reason
    core = belayq_rq.Queue("q1", connection=conn).belayq()
    assert core.stats()["in_flight"] == 0


def test_job_whose_worker_dies_every_time_fails_after_max_deliveries(
    conn: redis.Redis, workers: Workers
) -> None:
    """kill -9 of the whole worker (a SimpleWorker runs the job in-process), again and again:
    the claim after the last lost delivery fails the job instead of running it."""
    job = rq.Queue("q1", connection=conn).enqueue(jobs.kill_my_horse)
    for attempt in range(1, jobs.MAX_DELIVERIES + 1):
        w = workers.start("q1", worker_class=FAST_SIMPLE)
        wait_for(lambda n=attempt: len(runs(conn, job.id)) >= n, 30, f"attempt {attempt}")
        w.wait(10)
    workers.start("q1", worker_class=FAST_SIMPLE)
    wait_for(lambda: status(conn, job.id) == JobStatus.FAILED, 30, "the job to fail")
    assert len(runs(conn, job.id)) == jobs.MAX_DELIVERIES
    reason = Job.fetch(job.id, connection=conn).latest_result().exc_string
    print(f"\nFailedJobRegistry reason: {reason}")
    assert f"max_deliveries={jobs.MAX_DELIVERIES}" in reason
    assert status(conn, job.id) == JobStatus.FAILED


@pytest.mark.parametrize("worker_class", [FAST, FAST_SIMPLE], ids=["Worker", "SimpleWorker"])
def test_job_running_three_times_the_lease_runs_exactly_once(
    conn: redis.Redis, workers: Workers, worker_class: str
) -> None:
    workers.start("q1", worker_class=worker_class)
    workers.start("q1", worker_class=worker_class)  # would take the job if the lease lapsed
    seconds = 3 * jobs.SHORT_LEASE_MS / 1000 + 0.5
    job = rq.Queue("q1", connection=conn).enqueue(jobs.sleeper, seconds)
    wait_for(lambda: status(conn, job.id) == JobStatus.FINISHED, 60, "the job to finish")
    time.sleep(jobs.SHORT_LEASE_MS / 1000 + 1)  # a second run would have started by now
    assert [e for e, _, _ in runs(conn, job.id)] == ["start", "done"], workers.logs()
    assert_settled_cleanly(conn, "q1", job.id)


def test_job_holding_the_gil_keeps_its_lease_in_the_forking_worker(
    conn: redis.Redis, workers: Workers
) -> None:
    """The lease is renewed by the worker's parent, which runs no job code: a job that
    holds the GIL in its work horse for 3x the lease is not taken by the idle worker."""
    workers.start("q1", worker_class=FAST)
    workers.start("q1", worker_class=FAST)
    job = rq.Queue("q1", connection=conn).enqueue(jobs.hold_gil, 3 * jobs.SHORT_LEASE_MS / 1000)
    wait_for(lambda: status(conn, job.id) == JobStatus.FINISHED, 90, "the job to finish")
    held = Job.fetch(job.id, connection=conn).return_value()
    print(f"\n[Worker] a job held the GIL for {held:.1f} s (lease 2 s): ran once")
    assert held > 2 * jobs.SHORT_LEASE_MS / 1000
    time.sleep(jobs.SHORT_LEASE_MS / 1000 + 1)
    assert [e for e, _, _ in runs(conn, job.id)] == ["start", "done"], workers.logs()


def test_stopped_job_is_not_redelivered(conn: redis.Redis, workers: Workers) -> None:
    """`rq` stop-job (RQ kills the horse on purpose): STOPPED, acked, not run again."""
    from rq.command import send_stop_job_command

    w1 = workers.start("q1", worker_class=FAST)
    job = rq.Queue("q1", connection=conn).enqueue(jobs.sleeper, 30)
    wait_for(lambda: started(conn, job.id), 30, "the job to start")
    send_stop_job_command(conn, job.id)
    wait_for(lambda: status(conn, job.id) == JobStatus.STOPPED, 30, "the job to stop")
    time.sleep(jobs.SHORT_LEASE_MS / 1000 + 1)
    assert [e for e, _, _ in runs(conn, job.id)] == ["start"]
    core = belayq_rq.Queue("q1", connection=conn).belayq()
    assert core.stats()["in_flight"] == 0 and w1.poll() is None


def test_worker_pool_with_the_belayq_worker_class(conn: redis.Redis, rq_url: str,
                                                  workers: Workers) -> None:
    """`rq worker-pool -w belayq_rq.Worker` passes RQ's stock Queue; the workers upgrade it."""
    import subprocess

    from tests.plugins.rq.conftest import ROOT, RQ_BIN, child_env

    q = rq.Queue("q1", connection=conn)
    js = [q.enqueue(jobs.add, i, i) for i in range(4)]
    out = subprocess.run(
        [str(RQ_BIN), "worker-pool", "-u", rq_url, "-w", "belayq_rq.Worker", "-n", "2",
         "--burst", "q1"],
        env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert [status(conn, j.id) for j in js] == [JobStatus.FINISHED] * 4
    stats = belayq_rq.Queue("q1", connection=conn).belayq().stats()
    assert stats["claimed"] == 4 and stats["acked"] == 4, stats
    info = subprocess.run([str(RQ_BIN), "info", "-u", rq_url], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and "q1" in info.stdout, info.stdout + info.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("-w", "rq.worker.SpawnWorker", "--queue-class", "belayq_rq.Queue"),
        ("-w", "rq.worker.Worker", "--queue-class", "belayq_rq.Queue"),
        ("-w", "belayq_rq.Worker", "--queue-class", "rq.queue.Queue", "-j", "rq.job.Job"),
    ],
    ids=["SpawnWorker", "stock-Worker", "belayq-Worker-stock-queue-flag"],
)
def test_stock_worker_classes_refuse_belayq_queues_loudly(
    conn: redis.Redis, rq_url: str, args: tuple[str, ...]
) -> None:
    import subprocess

    from tests.plugins.rq.conftest import ROOT, RQ_BIN, child_env

    job = rq.Queue("q1", connection=conn).enqueue(jobs.add, 1, 2)
    out = subprocess.run(
        [str(RQ_BIN), "worker", "-u", rq_url, "--burst", *args, "q1"],
        env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    log = out.stdout + out.stderr
    if args[1] == "belayq_rq.Worker":
        # --queue-class rq.queue.Queue is RQ's own default: upgraded, the job runs on belayq.
        assert out.returncode == 0 and status(conn, job.id) == JobStatus.FINISHED, log
        return
    assert "is not a belayq_rq worker" in log or "SpawnWorker" in log, log
    assert status(conn, job.id) == JobStatus.QUEUED, log
    assert rq.Queue("q1", connection=conn).job_ids == [job.id]
