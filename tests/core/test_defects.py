"""One test per defect of the schema-1 core (the issue's list), each named after what it
proves; every one fails on that core (checked against a worktree of HEAD). They find the
queue's keys by its key prefix rather than by schema-2 key names, so each fails there on
its own assertion, not on a missing attribute (but for ``publish_result``, which that core
lacked).

Time is moved with the scripts' test-only clock skew, never by sleeping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ConfigError, ConnectionLost, ReliableQueue
from belayq.claim_any import claim_any
from belayq.keeper import KEEPER
from tests.conftest import make_client


@pytest.fixture(params=["redis", "redis62"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    c = make_client(request, request.param)
    yield c
    c.close()


def advance(q: ReliableQueue, ms: int) -> None:
    q._scripts.skew_ms += ms


def queue_keys(q: ReliableQueue) -> set[bytes]:
    """Every key of ``q`` that exists: its ready lists and whatever sits under its prefix."""
    base = q.keys.processing[: -len("processing")]
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in base) + "*"
    found = set(q.client.scan_iter(match=pattern, count=1_000))
    return found | {k.encode() for k in q.keys.levels if q.client.exists(k)}


def test_purge_keeps_the_record_of_an_identical_inline_entry_in_flight(
    client: Any, make_queue: Any
) -> None:
    q = make_queue(client, ready_key=f"rq:queue:{uuid.uuid4().hex[:10]}", payload_in_list=True)
    client.lpush(q.keys.ready, b"E")
    [d] = q.claim(timeout=0)
    client.lpush(q.keys.ready, b"E")
    assert q.purge() == 1
    assert q.ack(d) is True
    assert q.dead_letters() == []
    assert client.llen(q.keys.ready) == 0
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["dead"]) == (0, 0, 0)


def test_claim_any_gives_back_what_it_leased_when_a_later_queue_raises(
    client: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    q1 = make_queue(client, name=name + "-a", lease_ms=1_000)
    q2 = make_queue(client, name=name + "-b", lease_ms=1_000)
    msg_id = q1.publish(b"a")

    def unreachable(count: int = 1) -> Any:
        raise ConnectionLost("Redis unreachable (injected)")

    monkeypatch.setattr(q2, "try_claim", unreachable)
    with pytest.raises(ConnectionLost):
        claim_any([q1, q2], timeout=0, count=2)
    assert q1.held == []  # nobody will ever settle or extend it
    got = q1.claim(timeout=0)  # released: ready again at once...
    if not got:  # ... or at least once its lease ran out
        advance(q1, 1_001)
        got = q1.claim(timeout=0)
    assert [d.id for d in got] == [msg_id]


def test_a_forked_child_holds_none_of_the_parents_claims(client: Any, make_queue: Any) -> None:
    q = make_queue(client, lease_ms=1_000)
    msg_id = q.publish(b"a")
    [d] = q.claim(timeout=0)
    deadline = client.zscore(q.keys.leases, d.id)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 3
        try:
            code = 0 if q.held == [] else 1
            q._scripts.skew_ms += 500
            q.heartbeat()  # what its keeper would run: must extend nothing of the parent's
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child still held the parent's claim"
    assert client.zscore(q.keys.leases, msg_id) == deadline
    assert q.held == [d] and q.ack(d)


def test_replay_dead_with_no_ids_replays_nothing(client: Any, make_queue: Any) -> None:
    q = make_queue(client)
    for body in (b"1", b"2"):
        q.publish(body)
        [d] = q.claim(timeout=0)
        assert q.dead_letter(d, "bad")
    assert q.replay_dead(ids=[]) == 0
    s = q.stats()
    assert (s["dead"], s["ready"]) == (2, 0)


def test_claim_without_keeper_recovers_an_orphan_of_blmove_then_crash(
    client: Any, make_queue: Any
) -> None:
    crashed = make_queue(client, keeper=False, lease_ms=1_000)
    msg_id = crashed.publish(b"a")
    assert client.execute_command(*crashed.blmove_command(0.1)) == msg_id.encode()
    # ... and that consumer died before its lease. Another one, with no keeper either:
    q = make_queue(client, name=crashed.name, keeper=False, lease_ms=1_000)
    got: list[Any] = []
    for _ in range(3):
        got = q.claim(timeout=0)
        if got:
            break
        advance(q, 1_001)
    assert [(d.id, d.payload) for d in got] == [(msg_id, b"a")]
    assert q.stats()["landing"] == 0


def test_close_racing_a_claim_leaves_no_held_delivery_unkept(
    client: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue(client, keeper=True, lease_ms=30_000)
    msg_id = q.publish(b"a")
    run = q._scripts.run

    def claim_then_close(name: str, *args: Any, **kw: Any) -> Any:
        reply = run(name, *args, **kw)
        if name == "claim":  # close() on another thread, before the claims are recorded
            q.close()
        return reply

    monkeypatch.setattr(q._scripts, "run", claim_then_close)
    [d] = q.claim(timeout=0)
    monkeypatch.undo()
    kept = q in KEEPER._stops and [x.token for x in q.held] == [d.token]
    released = q.held == [] and q.stats()["in_flight"] == 0
    assert kept or released, "a held delivery with no keeper: its lease would run out"
    q.close()
    assert q.stats()["ready"] == 1 and q.claim(timeout=0)[0].id == msg_id


def test_keeper_after_drop_creates_no_key(client: Any, make_queue: Any) -> None:
    q = make_queue(client)
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    assert q.ack(d)
    q.publish(b"b")
    assert queue_keys(q)
    assert q.drop() is True
    left = queue_keys(q)
    for _ in range(3):
        q.heartbeat()
        q.sweep()
    assert queue_keys(q) - left == set(), "the keeper re-created keys of a dropped queue"
    assert queue_keys(q) == set()
    assert client.exists(*q.keys.all_keys()) == 0


def test_an_idle_consumer_writes_no_key_and_a_busy_one_no_key_per_call(
    client: Any, make_queue: Any
) -> None:
    idle = make_queue(client)
    for i in range(1_000):
        assert idle.claim(timeout=0) == []
        if i % 100 == 0:
            idle.heartbeat()
    assert queue_keys(idle) == set()

    busy = make_queue(client, name=idle.name + "-busy")

    def cycle() -> None:
        busy.publish(b"job")
        [d] = busy.claim(timeout=0)
        assert busy.ack(d)

    cycle()
    before = queue_keys(busy)
    for _ in range(1_000):
        cycle()
    assert queue_keys(busy) == before
    assert busy.stats()["acked"] == 1_001


def test_a_resent_publish_stores_the_message_once(
    client: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue(client)
    q._scripts.load_all()  # the first call of a process would load them: one command more
    sent: list[tuple[Any, ...]] = []
    execute = client.execute_command

    def recording(*args: Any, **kw: Any) -> Any:
        if args and args[0] in ("EVALSHA", "FCALL"):
            sent.append(args)
        return execute(*args, **kw)

    monkeypatch.setattr(client, "execute_command", recording)
    msg_id = q.publish(b"body")
    monkeypatch.undo()
    assert len(sent) == 1, [c[:4] for c in sent]
    [command] = sent
    client.execute_command(*command)  # redis-py re-sends after a dropped connection
    [d] = q.claim(timeout=0)
    assert (d.id, d.payload) == (msg_id, b"body")
    assert q.ack(d)
    client.execute_command(*command)  # ... even once the first was claimed and acked
    assert q.claim(timeout=0) == []
    assert q.stats()["ready"] == 0


def test_priorities_zero_to_nine_are_honoured_on_a_default_queue(
    client: Any, make_queue: Any
) -> None:
    q = make_queue(client)
    order = [9, 0, 5, 9, 0, 5, 1]
    sent = {q.publish(f"{p}-{i}", priority=p): (p, i) for i, p in enumerate(order)}
    got = []
    while True:
        claimed = q.claim(timeout=0)
        if not claimed:
            break
        got.append(sent[claimed[0].id])
        assert q.ack(claimed[0])
    assert got == sorted(sent.values())  # lowest priority first, FIFO within one
    with pytest.raises(ConfigError):
        q.publish(b"x", priority=10)


def test_dedup_of_a_finished_message_says_not_stored_and_gone(client: Any, make_queue: Any) -> None:
    q = make_queue(client)
    first = q.publish_result(b"a", dedup_id="order-1")
    assert first.stored is True
    [d] = q.claim(timeout=0)
    assert q.ack(d)
    again = q.publish_result(b"a", dedup_id="order-1")
    assert (again.id, again.stored, again.state) == (first.id, False, "gone")
    assert q.claim(timeout=0) == []


def test_tokens_differ_after_a_rollback_of_the_server(client: Any, make_queue: Any) -> None:
    q = make_queue(client)
    msg_id = q.publish(b"a")
    dump = {k: (client.dump(k), client.pttl(k)) for k in queue_keys(q)}
    [first] = q.claim(timeout=0)
    # Roll the queue back to before the claim (a failover to a replica that had not yet
    # received it, or a restart from an older snapshot).
    client.delete(*queue_keys(q))
    for key, (data, ttl) in dump.items():
        client.restore(key, max(ttl, 0), data, replace=True)
    [second] = q.claim(timeout=0)
    assert first.id == second.id == msg_id
    assert second.token != first.token
    assert q.ack(first) is False  # the rolled-back claim is refused
    assert q.ack(second) is True
    assert q.stats()["in_flight"] == 0


# -- found while reviewing schema 2 ----------------------------------------------------------


def test_an_inline_entry_pushed_again_while_its_copy_is_dead_is_a_message_of_its_own(
    client: Any, make_queue: Any
) -> None:
    q = make_queue(client, ready_key=f"rq:queue:{uuid.uuid4().hex[:10]}", payload_in_list=True,
                   max_deliveries=2)
    client.lpush(q.keys.ready, b"E")
    [d] = q.claim(timeout=0)
    assert q.dead_letter(d, "bad")
    client.lpush(q.keys.ready, b"E")  # pushed again by its producer
    [again] = q.claim(timeout=0)
    assert (again.deliveries, again.attempts) == (1, 1)  # fresh, not the dead letter's counts
    assert again.id != d.id and [x.id for x in q.dead_letters()] == [d.id]
    assert q.ack(again) is True
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["dead"], s.get("resubmitted")) == (0, 0, 1, None)


def test_ack_of_a_released_claim_is_refused(client: Any, make_queue: Any) -> None:
    q = make_queue(client)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    assert q.release([d]) == 1
    assert q.ack(d) is False  # the message waits again: nothing was settled
    assert q.stats()["ready"] == 1
