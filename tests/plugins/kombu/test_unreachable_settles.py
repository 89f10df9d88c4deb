"""Claims a plain kombu consumer never sees (an ETA still ahead, an expired or malformed
message, a scheduled task whose revokes cannot be read, a claim handed back) are settled
by the transport itself; when that settle cannot reach Redis it is retried by the core's
lease keeper, and when Redis refuses it the claim is abandoned to its lease. No claim is
ever kept alive (extended by the keeper) with nobody to settle it, and no such failure
holds back the other messages of the batch."""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import kombu
import pytest
import redis

from belayq import ReliableQueue
from belayq.errors import ConnectionLost
from belayq.revocations import Revocations

from .test_transport import core_queue, drain, publish, stats


class Outage:
    """Makes one method of every ReliableQueue (or Revocations) raise while ``on``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type, name: str,
                 exc: Exception) -> None:
        self.on = True
        self.calls = 0
        real = getattr(owner, name)

        def patched(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.calls += 1
                raise exc
            return real(obj, *args, **kwargs)

        monkeypatch.setattr(owner, name, patched)


def consume(conn: kombu.Connection, q: kombu.Queue, rounds: int = 6) -> list[Any]:
    """What a consumer (prefetch 10, acking) is handed over a few polls."""
    got: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        message.ack()

    with kombu.Consumer(conn, [q], callbacks=[on_message], accept=["json"], prefetch_count=10):
        for _ in range(rounds):
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.3)
    return got


def eta_in(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat()


def test_an_eta_deferral_that_cannot_reach_redis_is_retried_by_the_keeper(
    url: str, stock_url: str, port: int, kq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(stock_url, q, [{"later": 1}], headers={"eta": eta_in(3600)})  # a stock producer's
    outage = Outage(monkeypatch, ReliableQueue, "defer", ConnectionLost("simulated outage"))
    with kombu.Connection(url) as conn:
        with contextlib.suppress(ConnectionLost):
            assert consume(conn, q) == []
        assert outage.calls >= 1
        rq = conn.transport.queues[kq]
        # Held (so extended) only while a retry is pending: not forever, by nobody.
        assert (rq.unsettled, len(rq.held)) == (1, 1), (rq.unsettled, rq.held)
        outage.on = False
        rq.heartbeat()  # what the keeper's next beat does once Redis is back
        assert (rq.unsettled, rq.held) == (0, [])
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["delayed"]) == (0, 0, 1), s


def test_a_dead_letter_that_cannot_reach_redis_holds_back_nothing(
    url: str, port: int, kq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"good": 1}])
    redis.Redis(port=port).lpush(kq, b"not a kombu envelope")
    outage = Outage(monkeypatch, ReliableQueue, "dead_letter", ConnectionLost("simulated"))
    got: list[Any] = []
    with kombu.Connection(url) as conn:
        with contextlib.suppress(ConnectionLost):
            got = consume(conn, q)
        assert outage.calls >= 1
        rq = conn.transport.queues[kq]
        assert got == [{"good": 1}]
        assert rq.unsettled == 1
        outage.on = False
        rq.heartbeat()
        assert rq.unsettled == 0
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["dead"]) == (0, 0, 1), s


def test_scheduled_tasks_whose_revokes_cannot_be_read_are_abandoned_not_kept(
    url: str, stock_url: str, port: int, kq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    # Due already (not deferred), so the transport asks Redis whether it was revoked.
    publish(stock_url, q, [{"due": 1}], headers={"eta": eta_in(-1), "id": "task-1"})
    publish(stock_url, q, [{"plain": 1}])
    Outage(monkeypatch, Revocations, "revoked", ConnectionLost("simulated outage"))
    got: list[Any] = []
    with kombu.Connection(url) as conn:
        with contextlib.suppress(ConnectionLost):
            got = consume(conn, q)
        rq = conn.transport.queues[kq]
        assert got == [{"plain": 1}]
        assert rq.held == [] and rq.unsettled == 0  # left to its lease, then asked again
    s = stats(port, kq)
    assert (s["in_flight"], s["acked"]) == (1, 1), s


@pytest.mark.parametrize("op", ["requeue", "reject", "ack"])
def test_a_settle_redis_refuses_is_abandoned_to_its_lease(
    url: str, port: int, kq: str, op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # dead_letter_rejected is on by default: a reject without requeue dead-letters.
    method = {"requeue": "nack", "reject": "dead_letter", "ack": "ack_many"}[op]
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"a": 1}])
    with kombu.Connection(url) as conn:
        [m] = drain(conn, [q], 1, ack=False, prefetch_count=1)
        rq = conn.transport.queues[kq]
        outage = Outage(monkeypatch, ReliableQueue, method, redis.ResponseError("NOPERM no"))
        with contextlib.suppress(redis.ResponseError):
            if op == "ack":
                m.ack()
                conn.transport.claims.flush()  # an ack made on the polling thread waits
            else:
                m.reject(requeue=op == "requeue")
        assert outage.calls == 1
        assert (rq.held, rq.unsettled) == ([], 0)  # not kept alive: back after its lease
    assert stats(port, kq)["in_flight"] == 1


def test_a_claim_delivered_after_its_consumer_left_that_cannot_be_handed_back_is_abandoned(
    url: str, port: int, kq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    core_queue(port, kq).publish(b"payload")
    with kombu.Connection(url) as conn:
        channel = conn.default_channel
        rq = channel.queue(kq)
        deliveries = rq.claim(timeout=1)
        Outage(monkeypatch, ReliableQueue, "release", ConnectionLost("simulated outage"))
        with contextlib.suppress(ConnectionLost):
            assert channel.deliver(kq, rq, deliveries) is False  # nobody consumes kq
        assert (rq.held, rq.unsettled) == ([], 0)
    assert stats(port, kq)["in_flight"] == 1


def test_acks_sent_by_the_event_loop_whose_answer_is_lost_are_retried_by_the_keeper(
    url: str, port: int, kq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop's tick sends acks without waiting; one whose answer never comes (the
    connection dropped: it may not have run) is held again and retried by the lease
    keeper until it lands, never dropped."""
    from belayq.sent import Answer

    def lost(self: ReliableQueue, deliveries: Any) -> Answer[list[bool]]:
        def read() -> list[bool]:
            raise ConnectionLost("simulated: the answer never came")

        self.forget(deliveries)
        return Answer(read)

    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"a": 1}, {"a": 2}])
    with kombu.Connection(url) as conn:
        got = drain(conn, [q], 2, ack=False, prefetch_count=2)
        rq = conn.transport.queues[kq]
        claims = conn.transport.claims
        claims.defer_thread = threading.get_ident()  # acks wait for the loop's tick
        with monkeypatch.context() as m:
            m.setattr(ReliableQueue, "send_ack_many", lost)
            for message in got:
                message.ack()
            claims.flush(wait=False)
            assert rq.held == [] and stats(port, kq)["in_flight"] == 2
            claims.flush(wait=False)  # reads the lost answer
        assert rq.unsettled == 2  # the keeper retries them
        rq.retry_unsettled()
        assert rq.unsettled == 0
    s = stats(port, kq)
    assert (s["in_flight"], s["acked"]) == (0, 2), s
