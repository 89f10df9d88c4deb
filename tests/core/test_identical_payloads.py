"""An inline queue (``payload_in_list=True``: the list entries are the payloads and the id
derives from them) with identical payloads: every copy is its own message, through publish,
claim, the landing zone, the sweep and settling. On Redis 7.0 (functions, scripts) and 6.2."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ReliableQueue
from belayq.keys import rq_layout
from tests.conftest import make_client

MODES = [("redis", None), ("redis", False), ("redis62", None)]


@pytest.fixture(params=MODES, ids=["redis-functions", "redis-scripts", "redis62"])
def client_mode(request: pytest.FixtureRequest) -> Iterator[tuple[Any, bool | None]]:
    backend, functions = request.param
    client = make_client(request, backend)
    yield client, functions
    client.close()


@pytest.fixture
def q(client_mode: tuple[Any, bool | None], make_queue: Any) -> ReliableQueue:
    client, functions = client_mode
    return make_queue(client, ready_key=f"inline-{uuid.uuid4().hex[:10]}", payload_in_list=True,
                      lease_ms=1_000, max_deliveries=3, lua_functions=functions)


def states(q: ReliableQueue) -> tuple[int, int, int, int]:
    s = q.stats()
    return s["ready"], s["in_flight"], s["delayed"], s["dead"]


def test_a_copy_claimed_while_another_is_held_is_its_own_message(q: ReliableQueue) -> None:
    first, second = q.publish_result(b"same"), q.publish_result(b"same")
    assert first.stored and second.stored
    [a] = q.claim(timeout=0)
    [b] = q.claim(timeout=0)
    assert (a.payload, b.payload) == (b"same", b"same") and a.id != b.id
    assert states(q) == (0, 2, 0, 0)
    assert q.nack(b, reason="later") == "ready"  # the copy waits again, with its counts
    assert q.ack(a) is True
    [again] = q.claim(timeout=0)
    assert (again.payload, again.deliveries, again.attempts) == (b"same", 2, 2)
    assert q.ack(again) is True and states(q) == (0, 0, 0, 0)


def test_two_delayed_copies_stay_two(q: ReliableQueue) -> None:
    one = q.publish_result(b"later", delay_ms=50_000)
    two = q.publish_result(b"later", delay_ms=60_000)
    assert one.stored and two.stored and one.id != two.id
    assert states(q) == (0, 0, 2, 0)
    q._scripts.skew_ms = 61_000
    got = q.claim(timeout=0, count=5)
    assert len({d.id for d in got}) == 2 and [d.payload for d in got] == [b"later", b"later"]
    assert q.ack_many(got) == [True, True] and states(q) == (0, 0, 0, 0)


def test_a_delayed_copy_of_an_in_flight_payload_leaves_the_holder_alone(
    q: ReliableQueue,
) -> None:
    q.publish(b"job")
    [held] = q.claim(timeout=0)
    later = q.publish_result(b"job", delay_ms=30_000)
    assert later.stored and later.id != held.id
    assert q.extend([held]) == [True]
    assert q.ack(held) is True  # not refused as stale
    assert states(q) == (0, 0, 1, 0)
    q._scripts.skew_ms = 31_000
    [d] = q.claim(timeout=0)  # a copy waiting in a ready list has no id of its own
    assert (d.payload, d.deliveries) == (b"job", 1) and q.ack(d)
    assert not q.client.exists(q.keys.meta, q.keys.payloads, q.keys.leases)


def test_a_copy_pushed_while_another_is_dead_is_its_own_message(q: ReliableQueue) -> None:
    q.client.lpush(q.keys.ready, b"E")
    [d] = q.claim(timeout=0)
    assert q.dead_letter(d, "bad")
    q.client.lpush(q.keys.ready, b"E")  # pushed again by its producer
    [again] = q.claim(timeout=0)
    assert again.id != d.id and (again.deliveries, again.attempts) == (1, 1)
    assert [x.id for x in q.dead_letters()] == [d.id]  # the dead letter stays
    assert q.ack(again) and states(q) == (0, 0, 0, 1)
    assert q.replay_dead() == 1 and q.claim(timeout=0)[0].payload == b"E"


def test_expired_copies_go_back_and_run_again(q: ReliableQueue) -> None:
    q.publish_many([b"x", b"x", b"x"])
    got = q.claim(timeout=0, count=3)
    assert len({d.id for d in got}) == 3
    q._scripts.skew_ms = 2_000
    assert q.sweep().reclaimed == 3 and states(q) == (3, 0, 0, 0)
    again = q.claim(timeout=0, count=3)
    assert sorted(d.deliveries for d in again) == [2, 2, 2]
    assert q.ack_many(again) == [True] * 3 and states(q) == (0, 0, 0, 0)
    assert not q.client.exists(q.keys.meta, q.keys.payloads, q.keys.leases)


def test_landed_copies_whose_claimers_died_are_adopted_one_each(q: ReliableQueue) -> None:
    q.publish_many([b"y", b"y"])
    for _ in range(2):
        q.client.execute_command(*q.blmove_command(0.1))  # both claimers die here
    assert q.sweep().orphans_found == 2
    assert q.sweep().orphans_found == 0
    q._scripts.skew_ms = 2_000
    assert q.sweep().adopted == 2 and states(q) == (2, 0, 0, 0)
    got = q.claim(timeout=0, count=2)
    assert [d.payload for d in got] == [b"y", b"y"] and q.ack_many(got) == [True, True]


def test_purge_forgets_the_waiting_copies(q: ReliableQueue) -> None:
    q.publish_many([b"z", b"z"])
    got = q.claim(timeout=0, count=2)
    assert q.nack(got[0]) == "ready" and q.nack(got[1]) == "ready"  # both keep counts
    assert q.purge() == 2
    assert states(q) == (0, 0, 0, 0) and not q.client.exists(q.keys.meta, q.keys.payloads)


def test_an_rq_job_id_twice_in_its_list_is_run_twice(
    client_mode: tuple[Any, bool | None], make_queue: Any
) -> None:
    client, functions = client_mode
    layout = rq_layout(f"dup-{uuid.uuid4().hex[:8]}")
    q = make_queue(client, lua_functions=functions, **layout)
    client.rpush(layout["ready_key"], b"job-1", b"job-1")  # as stock RQ would run it twice
    got = q.claim(timeout=0, count=2)
    assert [d.payload for d in got] == [b"job-1", b"job-1"] and got[0].id != got[1].id
    assert q.ack_many(got) == [True, True]
