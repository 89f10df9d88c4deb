"""Settlements that could not reach Redis: ``retry_later`` keeps the claims held (so the
lease keeper extends them) and each keeper beat retries them until they land
(core/src/belayq/holding.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ConnectionLost, Delivery, ReliableQueue
from tests.conftest import make_client


@pytest.fixture(params=["redis", "redis62"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    c = make_client(request, request.param)
    yield c
    c.close()


def _claimed(make_queue: Any, client: Any, n: int) -> tuple[ReliableQueue, list[Delivery]]:
    q = make_queue(client, lease_ms=5_000)
    q.publish_many([f"m{i}".encode() for i in range(n)])
    got = q.claim(timeout=1, count=n)
    assert len(got) == n
    return q, got


class _Outage:
    """Makes the queue's settle calls raise ConnectionLost while on."""

    def __init__(self, q: ReliableQueue) -> None:
        self.on = True
        self.q = q
        for name in ("ack_many", "nack", "dead_letter", "release"):
            real = getattr(q, name)

            def down(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                if self.on:
                    raise ConnectionLost("simulated outage")
                return _real(*args, **kwargs)

            setattr(q, name, down)


def test_an_unsettled_ack_stays_held_and_lands_on_a_later_beat(
    make_queue: Any, client: Any
) -> None:
    q, [d] = _claimed(make_queue, client, 1)
    outage = _Outage(q)
    with pytest.raises(ConnectionLost):
        q.ack(d)
    q.retry_later("ack", [d])
    assert q.unsettled == 1 and q.held == [d]
    q.heartbeat()  # Redis still away: kept, and the beat extends the lease meanwhile
    assert q.unsettled == 1 and q.held == [d]
    outage.on = False
    q.heartbeat()
    assert q.unsettled == 0 and q.held == []
    s = q.stats()
    assert (s["in_flight"], s["acked"], s["ready"]) == (0, 1, 0), s


@pytest.mark.parametrize(
    ("op", "reason", "expect"),
    [
        ("nack", "failed", {"ready": 1, "nacked": 1}),
        ("dead", "poison", {"dead": 1}),
        ("release", "", {"ready": 1}),
    ],
)
def test_each_settlement_can_wait_for_redis(
    make_queue: Any, client: Any, op: str, reason: str, expect: dict[str, int]
) -> None:
    q, [d] = _claimed(make_queue, client, 1)
    outage = _Outage(q)
    q.retry_later(op, [d], reason)
    assert q.retry_unsettled() == 1
    outage.on = False
    assert q.retry_unsettled() == 0
    s = q.stats()
    assert s["in_flight"] == 0
    assert {k: s[k] for k in expect} == expect, s
    if op == "dead":
        [letter] = q.dead_letters()
        assert letter.id == d.id and letter.reason.startswith("poison")


def test_retries_keep_their_order_and_stop_at_the_first_failure(
    make_queue: Any, client: Any
) -> None:
    q, ds = _claimed(make_queue, client, 3)
    outage = _Outage(q)
    q.retry_later("ack", ds[:2])
    q.retry_later("release", ds[2:])
    calls: list[str] = []
    real_ack = q.ack_many

    def flaky(deliveries: Any) -> Any:
        calls.append(deliveries[0].id)
        if len(calls) == 2:  # the second settlement meets the outage again
            raise ConnectionLost("again")
        return real_ack(deliveries)

    outage.on = False
    q.ack_many = flaky  # type: ignore[method-assign]
    assert q.retry_unsettled() == 2  # the first landed; the second and the release wait
    assert calls == [ds[0].id, ds[1].id]
    assert q.retry_unsettled() == 0
    assert calls == [ds[0].id, ds[1].id, ds[1].id]
    s = q.stats()
    assert (s["acked"], s["ready"], s["in_flight"]) == (2, 1, 0), s


def test_a_retry_whose_lease_ran_out_changes_nothing(make_queue: Any, client: Any) -> None:
    q, [d] = _claimed(make_queue, client, 1)
    q.retry_later("ack", [d])
    q._scripts.skew_ms += 6_000  # the lease ran out before Redis came back ...
    [again] = q.claim(timeout=1)  # ... and another claim took the message
    assert again.id == d.id and again.token != d.token
    assert q.retry_unsettled() == 0  # refused as stale: the new holder keeps it
    assert q.stats()["in_flight"] == 1
    assert q.ack(again)


def test_an_unknown_settlement_is_refused(make_queue: Any, client: Any) -> None:
    q, [d] = _claimed(make_queue, client, 1)
    with pytest.raises(ValueError, match="op must be one of"):
        q.retry_later("forget", [d])
    assert q.unsettled == 0


def test_a_forked_child_inherits_no_unsettled_claims(make_queue: Any, client: Any) -> None:
    q, [d] = _claimed(make_queue, client, 1)
    q.retry_later("ack", [d])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's settlements are the parent's to retry
        os.write(w, f"{q.unsettled} {len(q.held)}".encode())
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    seen = os.read(r, 64).decode()
    os.close(r)
    assert status == 0 and seen == "0 0"
    assert q.unsettled == 1 and q.retry_unsettled() == 0
