"""A ``dramatiq`` worker stopped as a deploy stops it (SIGTERM) while an actor runs, on
belayq_dramatiq.Broker and, for comparison, stock RedisBroker: with Dramatiq's
ShutdownNotifications (``notify_shutdown=True``) the actor sees ``Shutdown`` and Dramatiq
settles the message as for any exception (Retries retries it; swallowed, it is acked);
without, the run is cut off when the worker's shutdown timeout (5 s here) passes, and the
message runs again on the next worker. Nothing is lost, no claim is left held."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import redis

from belayq_dramatiq import Broker
from tests.plugins.dramatiq.conftest import Workers, entries, wait_recorded
from tests.support import wait_for

#: The workers' ``--worker-shutdown-timeout`` (conftest), in s.
SHUTDOWN_TIMEOUT = 5.0


def send(broker: dramatiq.Broker, actor: str, *args: Any) -> None:
    broker.enqueue(dramatiq.Message(queue_name="default", actor_name=actor, args=args,
                                    kwargs={}, options={}))


def state(conn: redis.Redis, producer: dramatiq.Broker) -> dict[str, int]:
    """Where the queue's messages are, in either broker's keys: ``waiting`` (ready or
    delayed), ``held`` (claimed: a lease, or stock's ack sets), ``dead``, ``bodies``."""
    if isinstance(producer, Broker):
        stats = producer.store("default").core.stats()
        return {"waiting": stats["ready"] + stats["delayed"], "held": stats["in_flight"],
                "dead": stats["dead"], "bodies": conn.hlen("dramatiq:default.msgs")}
    acks = list(conn.scan_iter("dramatiq:__acks__.*"))
    return {"waiting": conn.llen("dramatiq:default") + conn.llen("dramatiq:default.DQ"),
            "held": sum(conn.scard(k) for k in acks),
            "dead": conn.zcard("dramatiq:default.XQ"),
            "bodies": conn.hlen("dramatiq:default.msgs") + conn.hlen("dramatiq:default.DQ.msgs")}


def settled(conn: redis.Redis, producer: dramatiq.Broker) -> None:
    """Wait until nothing is left: no message, no claim, no body (belayq deletes acked
    bodies in batches, and when its consumer finds the queue empty)."""
    empty = {"waiting": 0, "held": 0, "dead": 0, "bodies": 0}
    wait_for(lambda: state(conn, producer) == empty, 15, lambda: state(conn, producer))


def waiting_body(conn: redis.Redis) -> dramatiq.Message[Any]:
    """The one message body the queue holds (in ``.msgs``, or stock's ``.DQ.msgs``)."""
    bodies = [*conn.hvals("dramatiq:default.msgs"), *conn.hvals("dramatiq:default.DQ.msgs")]
    [body] = bodies
    return dramatiq.Message.decode(body)


def test_notified_actor_sees_shutdown_and_its_retry_runs_on_the_next_worker(
    producer: dramatiq.Broker, stock: bool, workers: Workers, conn: redis.Redis
) -> None:
    a = workers.start(stock=stock, threads=1).wait_ready()
    send(producer, "interruptible", "s", 60.0)
    [(_, first)] = wait_recorded(conn, "started", 1, 30)
    stopping = time.monotonic()
    assert a.stop() == 0, a.output()
    # Shutdown cut the run short: the worker did not wait out its shutdown timeout
    assert time.monotonic() - stopping < SHUTDOWN_TIMEOUT, a.output()
    assert entries(conn, "shutdown") == [("s", first)]
    # Retries re-enqueued it with a backoff and the run was acked: one message waits (in
    # Redis on belayq, on the .DQ list on stock), nothing is held
    assert state(conn, producer) == {"waiting": 1, "held": 0, "dead": 0, "bodies": 1}
    retry = waiting_body(conn)
    assert (retry.actor_name, retry.options["retries"]) == ("interruptible", 1)
    assert "Shutdown" in retry.options["traceback"]
    workers.start(stock=stock, threads=1)
    [(key, second)] = wait_recorded(conn, "done", 1, 30)
    assert key == "s" and second != first
    assert [k for k, _ in entries(conn, "started")] == ["s", "s"]
    settled(conn, producer)
    if isinstance(producer, Broker):
        stats = producer.store("default").core.stats()
        assert stats["acked"] == 2 and stats.get("reclaimed", 0) == 0, stats


def test_notified_actor_that_swallows_shutdown_is_acked(
    producer: dramatiq.Broker, stock: bool, workers: Workers, conn: redis.Redis
) -> None:
    a = workers.start(stock=stock, threads=1).wait_ready()
    send(producer, "interruptible", "s", 60.0, True)
    [(_, first)] = wait_recorded(conn, "started", 1, 30)
    assert a.stop() == 0, a.output()
    assert entries(conn, "shutdown") == [("s", first)]
    # it returned: Dramatiq counts the run a success and acks it; nothing comes back
    settled(conn, producer)
    if isinstance(producer, Broker):
        stats = producer.store("default").core.stats()
        assert stats["acked"] == 1 and stats["in_flight"] == 0, stats


def test_a_run_cut_off_by_shutdown_without_notify_runs_on_the_next_worker(
    producer: dramatiq.Broker, stock: bool, workers: Workers, conn: redis.Redis
) -> None:
    # stock's dead worker's claims come back after its heartbeat timeout (60 s by default,
    # at a maintenance pass); 2 s here, with maintenance on every command, to keep it short
    a = workers.start(stock=stock, threads=1, dq_stock_heartbeat_ms="2000").wait_ready()
    send(producer, "slow", "n", 30.0, 0.1)
    [(_, first)] = wait_recorded(conn, "started", 1, 30)
    stopping = time.monotonic()
    assert a.stop() == 0, a.output()
    # the worker waited its shutdown timeout for the run, then exited with it unfinished
    assert time.monotonic() - stopping >= SHUTDOWN_TIMEOUT - 0.5, a.output()
    assert entries(conn, "shutdown") == [] and entries(conn, "done") == []
    # the claim is still held: nothing ran it to its end, nothing settled it
    assert state(conn, producer) == {"waiting": 0, "held": 1, "dead": 0, "bodies": 1}
    workers.start(stock=stock, threads=1, dq_stock_heartbeat_ms="2000")
    [(key, second)] = wait_recorded(conn, "done", 1, 30)
    assert key == "n" and second != first
    assert [k for k, _ in entries(conn, "started")] == ["n", "n"]
    settled(conn, producer)
    if isinstance(producer, Broker):
        stats = producer.store("default").core.stats()
        assert stats["reclaimed"] == 1 and stats["acked"] == 1, stats
