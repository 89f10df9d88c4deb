"""Crash loops with real workers: ``celery worker`` (prefork) and ``rq worker`` (forking)
kill -9'd and restarted again and again, plus a poison task/job that kills its own pool
process or work horse on every run.

The contract under a crash loop: every task runs to the end at least once, and only a
task that was actually *running* when its worker died may use up a delivery; nothing
that merely sat in a dead worker's prefetch is ever dead-lettered. A real poison message
is quarantined after ``max_deliveries`` runs, with the reason, and the worker goes on.

Each test starts its own redis-server (RQ's keys are global; the Celery tests' keys are
per test anyway). Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import subprocess
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

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from tests.events import rq_jobs
from tests.events.workers import Proc, child_env
from tests.support import wait_for

RQ_BIN = Path(sys.executable).with_name("rq")
STEPS = (0, 3, 6, 9)
KILLS = 8
KILL_EVERY_S = 3.0
MAX_DELIVERIES = 5  # the Celery crash loop's (belayq_kombu's default)


# -- Celery --------------------------------------------------------------------------------


class CeleryRun:
    """One test's Celery setup: queue, record keys, worker command, producer app."""

    def __init__(self, server: RedisServer, conn: redis.Redis, procs: Callable[..., Proc],
                 *, lease_s: float = 3.0, max_deliveries: int = 5) -> None:
        from tests.events import crash_app

        self.conn = conn
        self.port = server.port
        self.procs = procs
        self.queue = f"crash-{uuid.uuid4().hex[:8]}"
        self.tag = f"ev-{uuid.uuid4().hex[:8]}"
        broker = f"belayq://127.0.0.1:{server.port}/0"
        backend = f"redis://127.0.0.1:{server.port}/1"
        self.env = child_env(
            CRASH_BROKER=broker, CRASH_BACKEND=backend, CRASH_QUEUE=self.queue,
            CRASH_TAG=self.tag, CRASH_LEASE=str(lease_s),
            CRASH_MAX_DELIVERIES=str(max_deliveries),
        )
        self.app = crash_app.make_app(broker, backend, self.queue, lease_s=lease_s,
                                      max_deliveries=max_deliveries)
        levels = [self.queue] + [f"{self.queue}\x06\x16{s}" for s in STEPS[1:]]
        # As belayq_kombu's Channel.queue() builds it: kombu's priority lists are its ready
        # lists, the envelopes their entries.
        self.core = ReliableQueue(
            conn, self.queue, ready_key=levels[0], level_keys=levels[1:],
            priority_steps=STEPS, payload_in_list=True, keeper=False,
        )

    def worker(self, *args: str) -> Proc:
        cmd = [sys.executable, "-m", "celery", "-A", "tests.events.crash_app", "worker",
               "-n", f"crash-{uuid.uuid4().hex[:6]}@%h", "-l", "info",
               "--without-mingle", "--without-gossip", "--without-heartbeat", *args]
        return self.procs(cmd, self.env)

    def wait_ready(self, w: Proc, timeout: float = 60) -> None:
        wait_for(lambda: " ready." in w.text() or not w.alive(), timeout, "a worker to start")
        assert w.alive(), w.text()[-3000:]

    def events(self, ev: str) -> collections.Counter[int]:
        return collections.Counter(
            int(x.split(b":")[0]) for x in self.conn.lrange(f"{self.tag}:{ev}", 0, -1))

    def send(self, name: str, *args: Any) -> Any:
        return self.app.send_task(name, args=args)


def task_arg(payload: bytes | None) -> int | None:
    """The first argument of the Celery task in a kombu envelope (``None`` if unreadable)."""
    if payload is None:
        return None
    try:
        envelope = json.loads(payload)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return int(args[0])
    except Exception:
        return None


@pytest.mark.timeout(240)
def test_celery_crash_loop_dead_letters_nothing_that_never_ran(
    server: RedisServer, conn: redis.Redis, procs: Callable[..., Proc]
) -> None:
    """160 tasks of 0.5 s (more than the kills consume); a prefork worker (2 processes,
    prefetch 4 each: up to 8 tasks claimed at once) is kill -9'd 8 times, 3 s after each is
    ready, with a lease of 3 s; then one worker runs to the end. Every task finishes, and no
    claim that only sat in a dead worker's prefetch counts as a delivery: nothing that never
    ran is dead-lettered, and a dead letter ran max_deliveries (5) times (so the list stays
    empty unless a task was running at 5 of the 8 kills)."""
    n = 160
    run = CeleryRun(server, conn, procs, max_deliveries=MAX_DELIVERIES)
    for i in range(n):
        run.send("crash.work", i, 0.5)
    assert run.core.stats()["ready"] == n
    t0 = time.monotonic()
    for cycle in range(KILLS):
        w = run.worker("-P", "prefork", "-c", "2", "--prefetch-multiplier", "4")
        # 3 s after the worker is ready (its start-up alone takes 3-4 s on a loaded box: a
        # kill 3 s after the spawn would hit a worker that never ran anything).
        run.wait_ready(w)
        ready_at = time.monotonic()
        time.sleep(max(0.0, ready_at + KILL_EVERY_S - time.monotonic()))
        w.kill9()
        s = run.core.stats()
        print(f"kill {cycle + 1} at {time.monotonic() - t0:5.1f} s: "
              f"started {len(run.events('start'))}, done {len(run.events('done'))}, "
              f"in flight {s['in_flight']}, claimed {s.get('claimed')}, dead {s['dead']}")
    started_before_final = set(run.events("start"))
    final = run.worker("-P", "prefork", "-c", "8", "--prefetch-multiplier", "4")
    run.wait_ready(final)

    def all_done_or_stuck() -> bool:
        s = run.core.stats()
        return len(run.events("done")) == n or (s["ready"] + s["in_flight"] + s["delayed"]) == 0

    wait_for(all_done_or_stuck, 150, lambda: f"the final worker: {run.core.stats()}", step=0.2)
    elapsed = time.monotonic() - t0
    dead = run.core.dead_letters()
    starts, done = run.events("start"), run.events("done")
    # (task, deliveries the core counted) of each dead letter
    burials = [(task_arg(d.payload), d.deliveries) for d in dead]
    innocents = sorted(i for i, _ in burials if i is not None and starts[i] == 0)
    # Dead-lettered before it ran max_deliveries times: some counted deliveries were claims
    # that only sat in a dead worker's prefetch.
    overcounted = [(i, starts[i] if i is not None else None, n_) for i, n_ in burials
                   if i is None or starts[i] < MAX_DELIVERIES]
    print(f"\ncelery crash loop: {KILLS} kills, all settled after {elapsed:.1f} s; "
          f"{len(done)}/{n} done, {sum(starts.values()) - len(starts)} re-runs, "
          f"{len(dead)} dead-lettered ({len(innocents)} never started); starts per task "
          f"{dict(sorted(collections.Counter(starts.values()).items()))}; "
          f"stats {run.core.stats()}")
    if dead:
        print(f"dead letters (task, starts, deliveries): "
              f"{[(i, starts[i] if i is not None else None, n_) for i, n_ in burials]}; "
              f"reason {dead[0].reason!r}")
    assert not innocents, (
        f"{len(innocents)} task(s) that never started were dead-lettered after the crash loop "
        f"(their only 'deliveries' were claims into a dead worker's prefetch): {innocents[:20]}; "
        f"reason: {dead[0].reason!r}")
    assert not overcounted, (
        f"dead-lettered before running max_deliveries={MAX_DELIVERIES} times, "
        f"(task, starts, deliveries): "
        f"{overcounted[:20]}; reason: {dead[0].reason!r}")
    # What may be dead-lettered is only a task whose worker died under it at each of its
    # max_deliveries runs (checked above); every other task finished.
    killed_every_run = {i for i, _ in burials}
    assert set(done) | killed_every_run == set(range(n)), sorted(set(range(n)) - set(done))[:20]
    assert started_before_final, "no task started during the crash loop: nothing was tested"
    # A task records "done" before Celery acks it: wait for the last acks.
    wait_for(lambda: run.core.stats()["in_flight"] == 0, 30, lambda: f"acks: {run.core.stats()}")
    s = run.core.stats()
    assert (s["ready"], s["in_flight"]) == (0, 0), s
    assert final.alive()


@pytest.mark.timeout(180)
def test_celery_task_that_kills_its_whole_worker_counts_runs_not_prefetch(
    server: RedisServer, conn: redis.Redis, procs: Callable[..., Proc]
) -> None:
    """A task that runs 2.5 s and then kills its whole worker (main process included, so
    no Celery code sees the loss) is dead-lettered after max_deliveries=2 runs: the main
    process reported its start (Tags.report_starts, on its next sweep tick).
    The three tasks the worker prefetched behind it each time never started there, so they
    lose nothing: they finish, and none is dead-lettered."""
    run = CeleryRun(server, conn, procs, max_deliveries=2)
    run.send("crash.kill_worker", 9, 2.5)
    for i in range(3):
        run.send("crash.work", i, 0.1)
    for cycle in range(4):
        if run.core.stats()["dead"]:
            break
        w = run.worker("-P", "prefork", "-c", "1", "--prefetch-multiplier", "4")
        run.wait_ready(w)
        wait_for(lambda w=w: not w.alive() or run.core.stats()["dead"], 60,
                 lambda c=cycle, w=w: f"cycle {c}: {run.core.stats()} {w.text()[-2000:]}")
        w.kill9()
        if cycle == 0:
            # Between the kill and the expiry of its lease, the killer's claim shows one
            # counted run and the prefetched ones none.
            metas = {task_arg(d.payload): (d.deliveries, d.attempts)
                     for d in _held_states(run)}
            assert metas.get(9) == (1, 1), metas
            assert all(v == (1, 0) for k, v in metas.items() if k != 9), metas
    final = run.worker("-P", "prefork", "-c", "2")
    run.wait_ready(final)
    wait_for(lambda: set(run.events("done")) >= {0, 1, 2}, 60,
             lambda: f"the prefetched tasks: {run.events('done')} {run.core.stats()}")
    [dead] = run.core.dead_letters()
    print(f"\nworker killer: ran {run.events('killer')[9]} times; dead letter "
          f"{dead.deliveries} deliveries / {dead.attempts} runs: {dead.reason!r}")
    assert task_arg(dead.payload) == 9 and dead.attempts == 2, dead
    assert run.events("killer")[9] == 2
    assert "lease expired" in dead.reason and "max_deliveries=2" in dead.reason, dead.reason
    # A task records "done" before Celery acks it: wait for the last ack.
    wait_for(lambda: run.core.stats()["in_flight"] == 0, 30, lambda: f"acks: {run.core.stats()}")
    s = run.core.stats()
    assert (s["ready"], s["in_flight"], s["dead"]) == (0, 0, 1), s


def _held_states(run: CeleryRun) -> list[Any]:
    """The claims in flight on ``run``'s queue, as dead-letter-like records (payload,
    deliveries, attempts) read from the core's state."""
    from belayq.admin import parse_meta
    from belayq.models import DeadLetter

    keys = run.core.keys
    out = []
    for raw_id in run.conn.zrange(keys.leases, 0, -1):
        msg_id = raw_id.decode()
        m = parse_meta(run.conn.hget(keys.meta, msg_id)) or {}
        out.append(DeadLetter(msg_id, run.conn.hget(keys.payloads, msg_id), "",
                              m.get("deliveries", 0), 0, m.get("attempts", 0)))
    return out


@pytest.mark.timeout(180)
def test_celery_poison_task_is_dead_lettered_after_max_deliveries_runs(
    server: RedisServer, conn: redis.Redis, procs: Callable[..., Proc]
) -> None:
    """A task that SIGKILLs its own pool process on every run (acks_late,
    task_reject_on_worker_lost, max_deliveries=3) runs 3 times, then sits in the
    dead-letter list with the reason; the worker runs a task sent before it, one sent
    with it and one sent after it was dead-lettered."""
    run = CeleryRun(server, conn, procs, max_deliveries=3)
    w = run.worker("-P", "prefork", "-c", "2", "--prefetch-multiplier", "4")
    run.wait_ready(w)
    run.send("crash.work", 1, 0.1)
    run.send("crash.poison", 7)
    run.send("crash.work", 2, 0.1)
    wait_for(lambda: run.core.stats()["dead"] == 1, 90,
             lambda: f"the dead letter: stats {run.core.stats()}, runs {run.events('poison')}\n"
                     f"{w.text()[-3000:]}", step=0.1)
    run.send("crash.work", 3, 0.1)
    wait_for(lambda: set(run.events("done")) >= {1, 2, 3}, 60,
             lambda: f"the healthy tasks: {run.events('done')}\n{w.text()[-3000:]}")
    time.sleep(3.0 + 1.5)  # a lease and a few sweeps: nothing brings the poison back
    [dead] = run.core.dead_letters()
    runs = run.events("poison")[7]
    print(f"\npoison task: ran {runs} times; dead letter: deliveries {dead.deliveries}, "
          f"reason {dead.reason!r}")
    assert task_arg(dead.payload) == 7
    assert runs == 3, f"ran {runs} times (max_deliveries=3)"
    assert dead.reason and "max_deliveries=3" in dead.reason, dead.reason
    assert dead.deliveries == 3, dead
    s = run.core.stats()
    assert (s["ready"], s["in_flight"], s["dead"]) == (0, 0, 1), s
    assert run.events("done") == collections.Counter({1: 1, 2: 1, 3: 1})
    assert w.alive(), w.text()[-3000:]


# -- RQ ------------------------------------------------------------------------------------


def rq_worker(procs: Callable[..., Proc], server: RedisServer, worker_class: str,
              *extra: str) -> Proc:
    cmd = [str(RQ_BIN), "worker", "-u", server.url, "-w", worker_class, "--logging_level",
           "INFO", *extra, "q1"]
    return procs(cmd, child_env())


def runs(conn: redis.Redis, job_id: str) -> list[str]:
    return [x.decode().split(":")[0] for x in conn.lrange(f"runs:{job_id}", 0, -1)]


def statuses(conn: redis.Redis, ids: list[str]) -> collections.Counter[str]:
    return collections.Counter(
        str(getattr(st, "value", st)) if j and (st := j.get_status(refresh=False)) else "missing"
        for j in Job.fetch_many(ids, connection=conn)
    )


@pytest.mark.timeout(240)
def test_rq_crash_loop_finishes_every_job_and_fails_none(
    server: RedisServer, conn: redis.Redis, procs: Callable[..., Proc]
) -> None:
    """100 jobs of 0.3 s; ``rq worker -w CrashWorker`` (forking, lease 3 s) is kill -9'd
    with its work horse 8 times, 3 s after each start; then burst workers run until the
    queue is drained. Every job FINISHED, except one that lost all its 5 runs to the kills
    (a redelivered job runs first, so the kills can keep hitting it)."""
    n = 100
    q = rq.Queue("q1", connection=conn)
    ids = [q.enqueue(rq_jobs.work, 0.3).id for _ in range(n)]
    core = rq_jobs.CrashQueue("q1", connection=conn).belayq()
    t0 = time.monotonic()
    for cycle in range(KILLS):
        started_at = time.monotonic()
        w = rq_worker(procs, server, "tests.events.rq_jobs.CrashWorker")
        wait_for(lambda w=w: core.stats()["in_flight"] > 0 or not w.alive(), 60,
                 "the worker to claim a job")
        assert w.alive(), w.text()[-3000:]
        time.sleep(max(0.0, started_at + KILL_EVERY_S - time.monotonic()))
        w.kill9()
        print(f"kill {cycle + 1} at {time.monotonic() - t0:5.1f} s: {dict(statuses(conn, ids))}")
    finished = JobStatus.FINISHED.value

    def drained() -> bool:
        if statuses(conn, ids)[finished] == n:
            return True
        s = core.stats()
        if s["ready"] == 0 and s["in_flight"] == 0:
            return True  # nothing left to run: settled, one way or another
        # A burst worker sweeps expired leases back (its maintenance pass and its claims),
        # runs what is ready, and exits when it finds the queue empty.
        w = rq_worker(procs, server, "tests.events.rq_jobs.CrashWorker", "--burst")
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(120)
        return False

    wait_for(drained, 180, lambda: f"the queue to drain: {core.stats()}", step=0.5)
    elapsed = time.monotonic() - t0
    counts = statuses(conn, ids)
    failed = FailedJobRegistry("q1", connection=conn).get_job_ids()
    reruns = sum(runs(conn, i).count("start") - 1 for i in ids)
    print(f"\nrq crash loop: {KILLS} kills, drained after {elapsed:.1f} s: {dict(counts)}, "
          f"{reruns} re-runs, stats {core.stats()}")
    # A redelivered job runs first, so a kill period close to the lease can hit the same
    # job on every cycle: after max_deliveries (5) started runs lost it is FAILED, as
    # designed. No other job may fail, and a failed one must really have lost 5 runs: 5
    # claims, each a started run, then the claim that finds it exhausted and fails it. A
    # kill may land between a claim and the job's first line (the horse's fork, slow on a
    # loaded box), so the job itself may have noted fewer starts than claims; a run may
    # also reach its body's end and be killed before RQ records it. Either way no success
    # was recorded for it.
    for i in failed:
        record = runs(conn, i)
        assert record.count("claim") >= rq_jobs.CrashQueue.max_deliveries, (i, record)
        assert record.count("start") <= record.count("claim"), (i, record)
    assert len(failed) <= KILLS // rq_jobs.CrashQueue.max_deliveries, failed
    ok = [i for i in ids if i not in failed]
    assert statuses(conn, ok) == {finished: len(ok)}, dict(counts)
    assert all(runs(conn, i).count("done") >= 1 for i in ok)
    s = core.stats()
    assert (s["ready"], s["in_flight"], s["dead"]) == (0, 0, 0), s


@pytest.mark.timeout(180)
def test_rq_poison_job_fails_after_max_deliveries_and_the_worker_goes_on(
    server: RedisServer, conn: redis.Redis, procs: Callable[..., Proc]
) -> None:
    """A job that SIGKILLs its work horse on every run (max_deliveries=3) runs 3 times and
    ends FAILED in RQ's FailedJobRegistry with belayq's reason; the same worker then runs a
    job enqueued after it."""
    w = rq_worker(procs, server, "tests.events.rq_jobs.PoisonWorker")
    q = rq.Queue("q1", connection=conn)
    poison = q.enqueue(rq_jobs.kill_my_horse)
    after = q.enqueue(rq_jobs.add, 1, 2)
    wait_for(lambda: Job.fetch(after.id, connection=conn).get_status() == JobStatus.FINISHED,
             90, lambda: f"the job after the poison\n{w.text()[-3000:]}", step=0.1)
    assert Job.fetch(poison.id, connection=conn).get_status() == JobStatus.FAILED
    assert poison.id in FailedJobRegistry("q1", connection=conn).get_job_ids()
    reason = Job.fetch(poison.id, connection=conn).latest_result().exc_string
    print(f"\nrq poison job: ran {len(runs(conn, poison.id))} times; reason {reason!r}")
    assert runs(conn, poison.id) == ["start"] * rq_jobs.POISON_MAX_DELIVERIES
    assert reason and "belayq" in reason
    assert f"max_deliveries={rq_jobs.POISON_MAX_DELIVERIES}" in reason
    assert Job.fetch(after.id, connection=conn).return_value() == 3
    # Still the same worker process, still consuming.
    later = q.enqueue(rq_jobs.add, 2, 2)
    wait_for(lambda: Job.fetch(later.id, connection=conn).get_status() == JobStatus.FINISHED,
             60, lambda: f"a later job\n{w.text()[-3000:]}", step=0.1)
    assert w.alive(), w.text()[-3000:]
    time.sleep(rq_jobs.LEASE_MS / 1000 + 1)  # a lease more: the poison does not come back
    assert runs(conn, poison.id) == ["start"] * rq_jobs.POISON_MAX_DELIVERIES
    s = rq_jobs.PoisonQueue("q1", connection=conn).belayq().stats()
    assert (s["ready"], s["in_flight"]) == (0, 0), s
