"""Real ``dramatiq`` worker processes on belayq_dramatiq.Broker: kill -9 mid-task, a poison
actor, a task outliving its lease, an ``eta`` across a worker restart, a stale ack after a
freeze. Leases are 1 s (the app's default here) so each proof takes seconds."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis

from belayq_dramatiq import Broker
from tests.conftest import ON_BOTH
from tests.plugins.dramatiq.conftest import Workers, entries, wait_recorded
from tests.support import wait_for

LEASE_MS = 1000


@pytest.fixture
def shards(request: pytest.FixtureRequest) -> int | None:
    """The broker's ``shards`` (None: stock's keys), as a test's parameter sets it."""
    return getattr(request, "param", None)


@pytest.fixture
def broker(url: str, conn: redis.Redis, shards: int | None) -> Iterator[Broker]:
    b = Broker(url=url, lease_ms=LEASE_MS, shards=shards)
    b.declare_queue("default")
    try:
        yield b
    finally:
        b.close()


def send(broker: dramatiq.Broker, actor: str, *args: Any, delay: int | None = None
         ) -> dramatiq.Message[Any]:
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="default", actor_name=actor, args=args, kwargs={}, options={})
    return broker.enqueue(message, delay=delay)


@ON_BOTH
@pytest.mark.parametrize("shards", [None, 3], ids=["stock_keys", "shards3"], indirect=True)
def test_kill_9_mid_task_every_message_finishes_within_the_lease(
    broker: Broker, workers: Workers, conn: redis.Redis, shards: int | None
) -> None:
    layout = "" if shards is None else str(shards)  # the app's DQ_SHARDS ("": stock's keys)
    # 3 s leases, renewed every second: a loaded box keeps up with that, so the one reclaim
    # is the kill's (1 s leases, renewed every 333 ms, can lapse under the CI's load)
    lease_ms = 3 * LEASE_MS
    a = workers.start(threads=2, dq_shards=layout, dq_lease_ms=str(lease_ms))
    send(broker, "slow", "long", 30.0, 0.2)
    for i in range(20):
        send(broker, "mark", f"m{i}")
    [(_, pid)] = wait_recorded(conn, "started", 1, 30)
    wait_recorded(conn, "done", 20, 30)
    # the replacement is up before the kill: what is timed is the recovery, not a start
    b = workers.start(threads=2, dq_shards=layout, dq_lease_ms=str(lease_ms))
    wait_for(lambda: "Worker process is ready for action." in b.output(), 60, b.output)
    a.kill()
    killed = time.monotonic()
    core = broker.store("default").core

    def state() -> str:
        return (f"{core.stats()} started={entries(conn, 'started')}\n"
                f"--- killed worker ---\n{a.output()}\n--- replacement ---\n{b.output()}")

    done = wait_for(lambda: len(e := entries(conn, "done")) >= 21 and e, 30, state)
    back = time.monotonic() - killed
    assert {k for k, _ in done} == {"long", *(f"m{i}" for i in range(20))}, state()
    others = [e for e in entries(conn, "started") if e[1] != pid]
    assert [k for k, _ in others] == ["long"], state()
    # the lease + one sweep (about 4 s here), generously
    assert back < lease_ms / 1000 + 10, (back, state())
    # the actor records its run before Dramatiq acks it
    wait_for(lambda: core.stats().get("acked") == 21, 10, state)
    stats = core.stats()
    assert stats["reclaimed"] == 1 and stats["in_flight"] == 0 and stats["dead"] == 0, state()


def test_a_worker_process_whose_main_process_was_killed_exits(
    broker: Broker, workers: Workers, conn: redis.Redis
) -> None:
    """kill -9 of the ``dramatiq`` main process alone: its worker process, orphaned, exits
    (else it would run on with its log pipe filling up, its leases kept alive), and the
    message it held runs on another worker."""
    a = workers.start(threads=1)
    send(broker, "slow", "orphaned", 30.0, 0.1)
    [(_, child)] = wait_recorded(conn, "started", 1, 30)
    assert child != a.proc.pid
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait(10)
    wait_for(lambda: not _alive(child), 10, f"worker process {child} to exit")
    workers.start(threads=1)
    [(key, pid)] = wait_recorded(conn, "done", 1, 30)
    assert key == "orphaned" and pid != child


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("strict", [True, False], ids=["strict_runs", "first_run_lazily"])
def test_poison_actor_is_dead_lettered_after_the_configured_runs(
    broker: Broker, workers: Workers, conn: redis.Redis, strict: bool
) -> None:
    send(broker, "poison", "p")
    core = broker.store("default").core
    for _ in range(4):  # a supervisor restarting the command each time it stops
        w = workers.start(threads=1, dq_max_deliveries="2", dq_strict_runs="1" if strict else "")
        # it dies running the message, or its sweep dead-letters it and it goes on
        wait_for(lambda w=w: w.proc.poll() is not None or core.dead_letters(), 60,
                 lambda w=w: f"{core.stats()} {entries(conn, 'started')}\n{w.output()}")
        if core.dead_letters():
            break
    dead = core.dead_letters()
    assert [d.attempts for d in dead] == [2], dead
    assert "max_deliveries=2" in dead[0].reason, dead[0].reason
    runs = len(entries(conn, "started"))
    # strict: every run is counted before it starts; else the first run is counted with the
    # next lease renewal, and a crash before it goes uncounted: one run more at most
    assert runs == 2 if strict else runs in (2, 3), runs
    send(broker, "mark", "after")  # the queue works on
    wait_recorded(conn, "done", 1, 30)


def test_a_task_outliving_its_lease_runs_once(
    broker: Broker, workers: Workers, conn: redis.Redis
) -> None:
    # 3 s leases here: the worker renews every second, which a loaded box still keeps up
    # with (1 s leases, renewed every 333 ms, can lapse under the CI's load: at least once)
    lease_ms = 3 * LEASE_MS
    workers.start(threads=1, dq_lease_ms=str(lease_ms))
    workers.start(threads=1, dq_lease_ms=str(lease_ms))
    send(broker, "slow", "long", 3.5 * lease_ms / 1000)
    wait_recorded(conn, "done", 1, 40)
    core = broker.store("default").core
    # the actor records its run before Dramatiq acks it
    wait_for(lambda: core.stats().get("acked") == 1, 10, core.stats)
    assert len(entries(conn, "started")) == 1
    assert core.stats().get("reclaimed", 0) == 0


def test_eta_waits_in_redis_across_a_worker_restart(
    broker: Broker, workers: Workers, conn: redis.Redis
) -> None:
    a = workers.start(threads=1)
    sent_ms = int(time.time() * 1000)
    message = send(broker, "mark", "eta", delay=4000)
    assert message.options["eta"] >= sent_ms + 4000
    core = broker.store("default").core
    wait_for(lambda: a.log.exists() and "Worker process is ready" in a.output(), 30, a.output)
    stats = core.stats()
    assert stats["delayed"] == 1 and stats["in_flight"] == 0  # not held by the worker
    assert a.stop() == 0
    workers.start(threads=1)
    [(key, _)] = wait_recorded(conn, "done", 1, 30)
    assert key == "eta" and int(time.time() * 1000) >= sent_ms + 4000
    # the actor records its run before Dramatiq acks it
    wait_for(lambda: core.stats().get("acked") == 1, 10, core.stats)


def test_a_frozen_workers_late_ack_is_refused(
    broker: Broker, workers: Workers, conn: redis.Redis
) -> None:
    # 3 s leases, renewed every second: only the frozen one lapses on a loaded box
    lease = str(3 * LEASE_MS)
    a = workers.start(threads=1, dq_lease_ms=lease)
    # first run 2 s, the second 4 s: the frozen first run acks while the second holds it
    send(broker, "slow", "f", 2.0, 4.0)
    [(_, frozen)] = wait_recorded(conn, "started", 1, 30)
    os.kill(frozen, signal.SIGSTOP)
    try:
        b = workers.start(threads=1, dq_lease_ms=lease)
        started = wait_recorded(conn, "started", 2, 30)
        assert started[1][1] != frozen
    finally:
        os.kill(frozen, signal.SIGCONT)
    core = broker.store("default").core

    def state() -> str:
        return (f"{core.stats()} started={entries(conn, 'started')} "
                f"done={entries(conn, 'done')}\n--- frozen ---\n{a.output()}\n"
                f"--- second ---\n{b.output()}")

    wait_for(lambda: core.stats().get("stale_acks"), 30, state)
    wait_for(lambda: len(entries(conn, "done")) >= 2, 30, state)
    wait_for(lambda: core.stats().get("acked") == 1, 10, state)
    stats = core.stats()
    assert stats["stale_acks"] == 1 and stats["in_flight"] == 0 and stats["ready"] == 0, state()
    assert len(entries(conn, "started")) == 2, state()
    # the accepted ack's body goes (in a batch, at the latest when its worker finds the
    # queue empty); the refused one deleted nothing the second claim needed
    wait_for(lambda: not conn.hlen("dramatiq:default.msgs"), 15,
             lambda: conn.hlen("dramatiq:default.msgs"))
