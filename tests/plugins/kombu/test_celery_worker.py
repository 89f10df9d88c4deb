"""Real ``celery worker`` subprocesses (solo and prefork) on belayq://: tasks run, results
come back, remote control works, and kill -9 / long tasks / ETAs keep the contract.

Leases are short here (2-3 s, sweep every 0.5 s) so the proofs run in seconds; the
measured recovery times are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tests.conftest import ON_BOTH
from tests.support import wait_for

from .conftest import CELERY, HERE, Worker

Records = Callable[[], list[dict[str, Any]]]


def app(celery_env: dict[str, str], **env: str) -> Any:
    """The worker_app module, imported here with the test's environment (a fresh copy)."""
    saved = dict(os.environ)
    os.environ.update({**celery_env, **env})
    sys.path.insert(0, str(HERE))
    try:
        sys.modules.pop("worker_app", None)
        return importlib.import_module("worker_app")
    finally:
        sys.path.remove(str(HERE))
        os.environ.clear()
        os.environ.update(saved)


def events(records: Records, ev: str) -> collections.Counter[int]:
    return collections.Counter(r["i"] for r in records() if r["ev"] == ev)


def control(celery_env: dict[str, str], *args: str) -> str:
    out = subprocess.run([*CELERY, "-A", "worker_app", *args], env=celery_env, cwd=HERE,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_tasks_run_results_come_back_and_remote_control_works(
    pool: str, workers: Callable[..., Worker], celery_env: dict[str, str], kq: str, port: int
) -> None:
    w = workers(f"--pool={pool}", "-c", "2").wait_ready()
    mod = app(celery_env)
    results = [mod.add.delay(i, i) for i in range(20)]
    assert [r.get(timeout=30) for r in results] == [2 * i for i in range(20)]
    node = w.name.replace("%h", socket.gethostname())
    assert "pong" in control(celery_env, "inspect", "ping", "-d", node, "-t", "10")
    assert kq in control(celery_env, "inspect", "active_queues", "-d", node, "-t", "10")
    assert "new rate limit set successfully" in control(
        celery_env, "control", "rate_limit", "worker_app.add", "100/s", "-d", node, "-t", "10")
    assert "transport" in w.text() and "belayq://" in w.text()
    # Each control call's auto-delete reply queue is deleted with every key belayq kept
    # for it (request replies expire on their own within 15 s).
    left = redis.Redis(port=port).keys("*.reply.celery.pidbox*")
    assert [k for k in left if b"}:r:" not in k] == []


def test_kill9_of_the_main_process_mid_task_loses_nothing(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records
) -> None:
    # Worker 1 takes all four tasks (two run, two wait in its prefetch); worker 2 is idle.
    # kill -9 of worker 1's whole process group: worker 2 must run all four within about
    # one lease (3 s here) plus one sweep period (0.5 s).
    env = {"BQ_LEASE": "3"}
    w1 = workers("--pool=prefork", "-c", "2", **env).wait_ready()
    mod = app(celery_env, **env)
    for i in range(4):  # long enough for worker 2 to start on a loaded machine
        mod.sleeper.delay(i, 12.0)
    wait_for(lambda: sum(events(records, "start").values()) >= 2, 30, "two tasks to start")
    workers("--pool=prefork", "-c", "2", **env).wait_ready()
    assert not events(records, "done"), "worker 1 finished before the kill: slow start-up?"
    w1.kill9()
    killed = time.time()
    running = set(events(records, "start")) - set(events(records, "done"))
    wait_for(lambda: len(events(records, "done")) == 4, 60, "every task done", step=0.2)
    restarts = sorted(r["t"] - killed for r in records() if r["ev"] == "start" and r["t"] > killed)
    all_done = max(r["t"] for r in records() if r["ev"] == "done") - killed
    print(f"\nkill -9 of the main process (acks_late, lease 3 s, sweep 0.5 s): worker 2 "
          f"restarted {len(restarts)} task(s) at {', '.join(f'{t:.1f}' for t in restarts)} s "
          f"after the kill ({len(running)} were running); all done at {all_done:.1f} s")
    assert set(events(records, "done")) == set(range(4))
    assert events(records, "done") == collections.Counter(range(4))
    assert all(events(records, "start")[i] == 2 for i in running)  # at-least-once, no more
    assert restarts[0] < 15, restarts  # generous: a shared 2-core box


@ON_BOTH
def test_kill9_of_a_pool_child_mid_task_reruns_it(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records
) -> None:
    w = workers("--pool=prefork", "-c", "2").wait_ready()
    mod = app(celery_env)
    for i in range(4):
        mod.sleeper.delay(i, 1.5)
    first = wait_for(lambda: [r for r in records() if r["ev"] == "start"], 30, "a task to start")
    victim = first[0]
    os.kill(victim["pid"], signal.SIGKILL)
    killed = time.time()
    wait_for(lambda: len(events(records, "done")) == 4, 60, "every task done", step=0.2)
    again = min(r["t"] for r in records() if r["ev"] == "start" and r["i"] == victim["i"]
                and r["t"] > killed)
    print(f"\nkill -9 of a pool child: its task ran again {again - killed:.2f} s later")
    assert events(records, "done") == collections.Counter(range(4))
    assert events(records, "start")[victim["i"]] == 2
    assert "WorkerLostError" in w.text()


def test_acks_late_false_protects_prefetched_tasks_not_running_ones(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records
) -> None:
    # Celery acks a task when a pool child starts it (acks_late=False), so a task running
    # at the kill is gone by Celery's own choice; everything prefetched and not started
    # comes back within the lease.
    env = {"BQ_LEASE": "3", "BQ_ACKS_LATE": "0"}
    w1 = workers("--pool=prefork", "-c", "2", **env).wait_ready()
    mod = app(celery_env, **env)
    for i in range(10):
        mod.sleeper.delay(i, 2.0)
    wait_for(lambda: sum(events(records, "start").values()) >= 2, 30, "two tasks to start")
    time.sleep(0.3)
    w1.kill9()
    running = set(events(records, "start")) - set(events(records, "done"))
    workers("--pool=prefork", "-c", "2", **env).wait_ready()
    expected = set(range(10)) - running
    wait_for(lambda: set(events(records, "done")) >= expected, 60, "the rest", step=0.2)
    time.sleep(4)  # a lease more: nothing else comes back
    print(f"\nacks_late=False: {len(running)} task(s) running at the kill were acked at start "
          f"and not re-run; the other {len(expected)} all completed")
    assert set(events(records, "done")) == expected
    assert all(events(records, "start")[i] == 1 for i in running)


def test_a_task_and_an_eta_three_leases_long_run_exactly_once(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    env = {"BQ_LEASE": "2"}
    workers("--pool=solo", **env).wait_ready()
    mod = app(celery_env, **env)
    mod.sleeper.delay(1, 6.0)  # 3 x the lease
    mod.sleeper.apply_async((2, 0.1), countdown=6.0)  # ETA 3 x the lease
    wait_for(lambda: events(records, "start")[1] == 1, 30, "the long task to start")
    workers("--pool=prefork", "-c", "2", **env).wait_ready()  # a rival that would take copies
    wait_for(lambda: len(events(records, "done")) == 2, 40, "both done", step=0.2)
    time.sleep(2.5)
    assert events(records, "start") == collections.Counter({1: 1, 2: 1})
    assert events(records, "done") == collections.Counter({1: 1, 2: 1})
    stats = _stats(port, kq)
    assert stats.get("reclaimed", 0) == 0 and stats.get("stale_acks", 0) == 0, stats


def test_a_poison_task_is_dead_lettered_after_max_deliveries(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    env = {"BQ_MAX_DELIVERIES": "3"}
    workers("--pool=prefork", "-c", "1", **env).wait_ready()
    mod = app(celery_env, **env)
    mod.kill_self.delay(7)
    mod.sleeper.delay(8, 0.1)
    wait_for(lambda: events(records, "done")[8] == 1, 60, "the healthy task")
    wait_for(lambda: _stats(port, kq)["dead"] == 1, 60, f"the dead letter {_stats(port, kq)}")
    time.sleep(1)
    assert events(records, "start")[7] == 3
    out = subprocess.run([sys.executable, "-m", "belayq_kombu", "dead-letters", "--url",
                          celery_env["BQ_BROKER"], "--queue", kq], capture_output=True, text=True)
    [dead] = [json.loads(line) for line in out.stdout.splitlines()]
    assert dead["reason"].startswith("rejected with requeue") and dead["deliveries"] == 3, dead
    assert "max_deliveries=3" in dead["reason"], dead


def test_a_connection_blip_does_not_rerun_running_tasks(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    # Every client connection is killed while two acks_late tasks run and two wait in the
    # prefetch. Celery reconnects; the running ones keep their leases (no copy runs while
    # they do), the waiting ones are released and delivered again (uncounted).
    import celery

    w = workers("--pool=prefork", "-c", "2").wait_ready()
    mod = app(celery_env)
    for i in range(4):
        mod.sleeper.delay(i, 4.0)
    wait_for(lambda: sum(events(records, "start").values()) >= 2, 30, "two tasks to start")
    killed = redis.Redis(port=port).client_kill_filter(_type="normal", skipme=True)
    wait_for(lambda: len(events(records, "done")) == 4, 60, "every task done", step=0.2)
    time.sleep(2)  # a few sweeps: nothing may come back
    print(f"\nconnection blip: killed {killed} client connection(s) mid-task")
    assert "Connection to broker lost" in w.text()
    assert "keeping the leases of 2 running task(s)" in w.text()
    starts = events(records, "start")
    assert starts == collections.Counter(range(4)), starts
    stats = _stats(port, kq)
    assert stats.get("stale_acks", 0) == 0, stats
    if tuple(map(int, celery.__version__.split(".")[:3])) >= (5, 6, 3):
        assert (stats["acked"], stats["in_flight"]) == (4, 0), stats
    else:
        # Celery up to 5.6.2 loses the completion of a task that ran through the reconnect
        # and never acks it; belayq keeps its lease (no second run) for blip_keep_max.
        assert (stats["acked"], stats["in_flight"], stats["leased"]) == (2, 2, 2), stats


def test_a_task_kept_in_the_pipe_of_a_child_that_dies_runs(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    # A blip makes Celery's pool forget that its child is busy (pool.flush()), so the next
    # task is written to the pipe of the child still running a long one. A second blip keeps
    # that written task's claim; the child then dies before reading it. The task never ran:
    # its claim must be released and the task run, not leased for blip_keep_max (1 h).
    w = workers("--pool=prefork", "-c", "1", BQ_LEASE="3").wait_ready()
    mod = app(celery_env, BQ_LEASE="3")
    client = redis.Redis(port=port)
    mod.sleeper.delay(0, 8.0)
    [long] = wait_for(lambda: [r for r in records() if r["ev"] == "start"], 30, "task 0 to start")
    client.client_kill_filter(_type="normal", skipme=True)
    wait_for(lambda: "keeping the leases of 1 running task(s)" in w.text(), 10, "a blip")
    wait_for(lambda: w.text().count("Connected to belayq://") == 2, 10, "the reconnect")
    mod.sleeper.delay(1, 0.1)
    wait_for(lambda: w.text().count("sleeper[") == 2, 10, "task 1 to be received")
    time.sleep(0.3)  # written to the busy child's pipe
    client.client_kill_filter(_type="normal", skipme=True)
    wait_for(lambda: "(1 written to a pool child, not yet started)" in w.text(), 10,
             "a second blip keeping task 1 written")
    os.kill(long["pid"], signal.SIGKILL)
    killed = time.time()
    wait_for(lambda: events(records, "done")[1] == 1, 30, "task 1 to run", step=0.2)
    print(f"\ntask 1 ran {time.time() - killed:.2f} s after the death of the child it was "
          "written to")
    assert events(records, "start")[1] == 1
    wait_for(lambda: _stats(port, kq)["in_flight"] == 0, 30, "nothing left in flight")


def _stats(port: int, name: str) -> dict[str, int]:
    from .test_transport import stats

    return stats(port, name)


def test_an_expired_task_is_revoked_by_celery_not_dropped(
    workers: Callable[..., Worker], celery_env: dict[str, str]
) -> None:
    # Celery sets the AMQP expiration of a task with `expires`; belayq leaves such a task
    # to Celery, which marks it REVOKED (a silent broker-side drop would leave it PENDING).
    import celery.exceptions

    workers("--pool=solo", "--prefetch-multiplier=1").wait_ready()
    mod = app(celery_env)
    mod.sleeper.delay(0, 3.0)
    result = mod.add.apply_async((1, 1), expires=1)
    with pytest.raises(celery.exceptions.TaskRevokedError):
        result.get(timeout=30)
    assert result.status == "REVOKED"


def test_an_idle_worker_without_the_bell_still_runs_low_priority_tasks(
    workers: Callable[..., Worker], celery_env: dict[str, str], port: int, kq: str
) -> None:
    # priority_bell=False (a fleet shared with stock workers): the worker's blocking claim
    # times out every sweep period and then claims from the lower-priority lists.
    workers("--pool=solo", BQ_BELL="0").wait_ready()
    mod = app(celery_env, BQ_BELL="0")
    results = [mod.add.apply_async((i, i), priority=9) for i in range(3)]
    assert [r.get(timeout=30) for r in results] == [0, 2, 4]
    for entry in redis.Redis(port=port).lrange(kq, 0, -1):
        json.loads(entry)  # the first list never held the bell
