"""The lease keeper's beat (core/src/belayq/keeper.py, holding.py): what it extends, and
what a beat racing the consumer's own settle or start report must not do, and what
``close()`` does with a settle still waiting for Redis."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from belayq import ConnectionLost, DurabilityError
from belayq.admin import parse_meta


def test_heartbeat_racing_an_ack_is_not_a_stale_ack(r, make_queue, caplog):
    """Found by the 50x10k run (stale_acks 2..6 per run although every ack succeeded).
    Deterministic form: the consumer acks between the keeper's snapshot and its extend."""
    q = make_queue(r)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    real_extend = q._extend

    def extend_after_the_ack(deliveries: Any, **kw: Any) -> list[bool]:
        assert q.ack(d)  # the consumer thread wins the race
        return real_extend(deliveries, **kw)

    q._extend = extend_after_the_ack  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="belayq"):
        q.heartbeat()
    s = q.stats()
    assert s["acked"] == 1
    assert "was lost" not in caplog.text, caplog.text
    assert s.get("stale_acks", 0) == 0, s


def _attempts(r: Any, q: Any, d: Any) -> int:
    """The runs the queue counted for ``d``'s message."""
    meta = parse_meta(r.hget(q.keys.meta, d.id))
    assert meta is not None
    return int(meta["attempts"])


def test_a_start_reported_while_an_extend_is_in_flight_is_sent_with_the_next(r, make_queue):
    """A slow server: ``start()`` runs on another thread while the beat's extend is on its
    way; the report must ride on the next extend, not be dropped with the ones sent."""
    q = make_queue(r, claim_starts=False, lease_ms=5_000)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    real_run = q._scripts.run

    def slow_run(name: str, *args: Any, **kw: Any) -> Any:
        if name == "extend":
            reporter = threading.Thread(target=q.start, args=([d],))
            reporter.start()  # the consumer starts the work while the extend is in flight
            reporter.join()
        return real_run(name, *args, **kw)

    q._scripts.run = slow_run  # type: ignore[method-assign]
    q.heartbeat()
    q._scripts.run = real_run  # type: ignore[method-assign]
    q.heartbeat()
    assert _attempts(r, q, d) == 1, "the start was never counted"


def test_an_extend_that_failed_keeps_every_start_report(r, make_queue):
    q = make_queue(r, claim_starts=False, lease_ms=5_000)
    q.publish_many([b"a", b"b"])
    got = q.claim(timeout=0, count=2)
    q.start(got)
    real_run = q._scripts.run

    def down(name: str, *args: Any, **kw: Any) -> Any:
        raise redis.ConnectionError("simulated outage")

    q._scripts.run = down  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):
        q.heartbeat()
    q._scripts.run = real_run  # type: ignore[method-assign]
    q.heartbeat()
    assert [_attempts(r, q, d) for d in got] == [1, 1]


_SETTLE_METHODS = {"ack": "ack_many", "nack": "nack", "dead": "dead_letter"}
_SETTLED = {
    "ack": {"acked": 1, "ready": 0, "in_flight": 0},
    "nack": {"nacked": 1, "ready": 1, "in_flight": 0},
    "dead": {"dead": 1, "ready": 0, "in_flight": 0},
}


def _pending(q: Any, op: str) -> tuple[Any, Callable[[bool], None]]:
    """Claim one message and leave its ``op`` settle waiting for Redis (``retry_later``);
    returns the claim and a switch of the simulated outage (of that settle only)."""
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    real = getattr(q, _SETTLE_METHODS[op])
    outage = [True]

    def settle(*args: Any, **kwargs: Any) -> Any:
        if outage[0]:
            raise ConnectionLost("simulated outage")
        return real(*args, **kwargs)

    setattr(q, _SETTLE_METHODS[op], settle)
    q.retry_later(op, [d], "failed")
    return d, lambda on: outage.__setitem__(0, on)


@pytest.mark.parametrize("op", ["ack", "nack", "dead"])
def test_close_sends_a_pending_settle_instead_of_releasing_its_claim(r, make_queue, op):
    q = make_queue(r, lease_ms=5_000)
    d, outage = _pending(q, op)
    outage(False)
    q.close()
    s = q.stats()
    assert {k: s.get(k, 0) for k in _SETTLED[op]} == _SETTLED[op], s
    assert q.held == [] and q.unsettled == 0


@pytest.mark.parametrize("op", ["ack", "nack", "dead"])
def test_close_leaves_a_claim_whose_settle_cannot_be_sent_to_its_lease(
    r, make_queue, caplog, op
):
    """Not released (a release is an uncounted delivery: a finished message would run
    again, a poison one escape its count), not dropped silently: left to its lease, whose
    expiry counts the run, with a warning that names it."""
    q = make_queue(r, lease_ms=300)
    d, _ = _pending(q, op)
    with caplog.at_level(logging.WARNING, logger="belayq"):
        q.close()
    assert d.id in caplog.text and op in caplog.text, caplog.text
    s = q.stats()
    assert (s["in_flight"], s["ready"]) == (1, 0), s
    assert q.held == [] and q.unsettled == 0
    time.sleep(0.4)
    [again] = q.claim(timeout=1)
    assert again.id == d.id and again.deliveries == 2 and again.attempts == 2, again


def test_the_beat_waits_for_no_replica(r, make_queue, caplog):
    """``wait_replicas=1`` on a server with no replica: every durable call would wait and
    raise DurabilityError. The beat's extend and the settle it retries do not wait."""
    q = make_queue(r, wait_replicas=1, wait_timeout_ms=100, claim_starts=False)
    with pytest.raises(DurabilityError):
        q.publish_many([b"a", b"b"])  # stored all the same
    held, acked = q.claim(timeout=1, count=2)
    q.start([held])
    q.retry_later("ack", [acked])
    with caplog.at_level(logging.WARNING, logger="belayq"):
        q.heartbeat()
    assert "replica" not in caplog.text, caplog.text
    s = q.stats()
    assert (s["acked"], s["in_flight"]) == (1, 1), s
    assert q.held == [held] and q.unsettled == 0
    assert _attempts(r, q, held) == 1


def test_a_claim_another_process_acked_is_dropped_without_a_loss_warning(r, make_queue, caplog):
    """An RQ work horse acks the claim its parent's keeper holds: the parent's next beat finds
    the lease gone, and that is no loss (nothing will be redelivered)."""
    import os

    q = make_queue(r)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    pid = os.fork()
    if pid == 0:  # the work horse: its own connection, the parent's claim
        os._exit(0 if q.ack(d) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    with caplog.at_level(logging.DEBUG, logger="belayq"):
        q.heartbeat()
    assert q.held == []
    assert "was lost" not in caplog.text, caplog.text
    assert "settled by another process" in caplog.text, caplog.text


def test_a_claim_swept_and_claimed_again_is_reported_lost(r, make_queue, caplog):
    q = make_queue(r, lease_ms=100)
    other = make_queue(r)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    time.sleep(0.2)
    other.sweep()
    [again] = other.claim(timeout=0)
    assert again.id == d.id and again.token != d.token
    with caplog.at_level(logging.DEBUG, logger="belayq"):
        q.heartbeat()
    assert q.held == []
    assert f"lease of {d.id} on {q.name} was lost" in caplog.text, caplog.text
