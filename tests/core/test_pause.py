"""Pausing and resuming a queue's claims, against real servers (Redis 7 as functions and as
scripts, Redis 6.2): a paused queue hands out nothing on any claim path while publishes,
extends, acks and the sweep go on; a resume wakes blocked consumers at once; a claim blocked
before the pause hands back what it takes, uncounted; bad arguments change nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from belayq import ReliableQueue
from belayq.blocking import BlockingClaim
from belayq.claim_any import claim_any
from belayq.errors import ConfigError
from belayq.sharded import ShardedQueue
from tests.support import wait_for


def dumps(q: ReliableQueue) -> dict[str, Any]:
    return {k: q.client.dump(k) for k in q.keys.all_keys()}


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[tuple[Any, float]]]:
    """Run ``fn`` in a thread; its result and when it returned (monotonic s) land in the
    list."""
    out: list[tuple[Any, float]] = []
    t = threading.Thread(target=lambda: out.append((fn(), time.monotonic())), daemon=True)
    t.start()
    return t, out


def test_a_paused_queue_hands_out_nothing_while_publish_extend_and_ack_go_on(
    q: ReliableQueue, make_queue: Any
) -> None:
    q.publish(b"held")
    [held] = q.claim(timeout=0)
    assert q.pause() is True
    assert q.publish(b"new")  # publishing goes on
    q.publish_many([b"n2", b"n3"])
    before = q.stats()
    assert before["paused"] == 1 and before["ready"] == 3 and before["paused_since_ms"] > 0

    assert q.claim(timeout=0) == []
    assert q.try_claim(3) == ([], -2)
    started = time.monotonic()
    assert q.claim(timeout=0.4, count=2) == []  # blocks on the unpaused list, not the ready one
    assert time.monotonic() - started >= 0.35
    assert claim_any([q], timeout=0) == []
    other = make_queue(q.client, f"{q.name}-other", lua_functions=q.config.lua_functions)
    other.publish(b"elsewhere")
    got = claim_any([q, other], timeout=0.2, count=5)  # the paused queue first, yet skipped
    assert [d.payload for d in got] == [b"elsewhere"]
    c = BlockingClaim(q)
    c.send(0.2)
    assert c.read() is None  # the event loops' BLMOVE waits on the unpaused list
    c.close()

    assert q.extend([held]) == [True]  # the holder keeps its lease
    acked, claimed = q.ack_and_claim([held], 3)
    assert acked == [True] and claimed == []
    after = q.stats()
    assert after["claimed"] == before["claimed"] and after["ready"] == 3
    assert after["acked"] == 1 and after["in_flight"] == 0

    assert q.resume() is True
    assert [d.payload for d in q.claim(timeout=0, count=3)] == [b"new", b"n2", b"n3"]
    assert q.stats()["paused"] == 0


def test_pause_and_resume_are_idempotent_and_write_nothing_the_second_time(
    q: ReliableQueue,
) -> None:
    q.publish(b"a")
    assert q.resume() is False  # not paused: nothing to resume
    assert q.pause() is True
    kept = dumps(q)
    assert q.pause() is False
    assert dumps(q) == kept
    assert q.resume() is True and q.resume() is False


def test_the_sweep_returns_expired_leases_while_paused_and_nobody_claims_them(
    q: ReliableQueue,
) -> None:
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    q.pause()
    q._scripts.skew_ms = 10_000  # the lease (5 s) has run out
    assert q.sweep().reclaimed == 1
    assert q.stats()["ready"] == 1
    assert q.claim(timeout=0) == []
    assert q.ack(d) is False  # the late holder is fenced off as usual
    q.resume()
    [again] = q.claim(timeout=0)
    assert again.id == d.id and again.deliveries == 2


def test_resume_wakes_every_blocked_consumer_at_once(q: ReliableQueue) -> None:
    q.pause()
    q.publish_many([b"1", b"2", b"3"])
    waiting = [in_thread(lambda: q.claim(timeout=8)) for _ in range(3)]
    time.sleep(0.5)
    assert all(not out for _, out in waiting)  # paused: nothing handed out
    resumed = time.monotonic()
    q.resume()
    for t, _ in waiting:
        t.join(8)
    got = [out[0] for _, out in waiting]
    assert sorted(d.payload for deliveries, _ in got for d in deliveries) == [b"1", b"2", b"3"]
    slowest = max(at for _, at in got) - resumed
    assert slowest < 1.0, f"a blocked consumer woke {slowest:.3f} s after the resume"


def test_a_claim_blocked_before_the_pause_hands_back_what_it_takes(q: ReliableQueue) -> None:
    t, out = in_thread(lambda: q.claim(timeout=8))  # blocked in BLMOVE on the ready list
    wait_for(lambda: int(q.client.info("clients")["blocked_clients"]) >= 1, 5,
             "the claim to block")
    q.pause()
    msg_id = q.publish(b"after-pause")
    time.sleep(0.5)
    assert not out  # its BLMOVE took the message; the lease script handed it back
    s = q.stats()
    assert s["ready"] == 1 and s["in_flight"] == 0 and s["landing"] == 0
    assert s.get("claimed", 0) == 0 and s.get("lost_claims", 0) == 0
    assert q.client.hget(q.keys.meta, msg_id) is None  # no delivery counted
    q.resume()
    t.join(8)
    [(deliveries, _)] = out
    assert [(d.id, d.deliveries) for d in deliveries] == [(msg_id, 1)]


def test_an_inline_queue_gets_its_entry_back_whole(make_queue: Any, q: ReliableQueue) -> None:
    rq = make_queue(q.client, f"inline-{q.name}", ready_key=f"rq:queue:{q.name}",
                    payload_in_list=True, ready_head="left",
                    lua_functions=q.config.lua_functions)
    rq.publish(b"job-a")
    t, out = in_thread(lambda: rq.claim(timeout=8))
    wait_for(lambda: out, 5, "the first claim")
    [(first, _)] = out
    assert [d.payload for d in first] == [b"job-a"]
    t2, out2 = in_thread(lambda: rq.claim(timeout=8))
    wait_for(lambda: int(rq.client.info("clients")["blocked_clients"]) >= 1, 5, "a block")
    rq.pause()
    rq.publish(b"job-b")
    time.sleep(0.4)
    assert not out2
    assert rq.client.lrange(rq.keys.ready, 0, -1) == [b"job-b"]
    rq.resume()
    t2.join(8)
    assert [d.payload for d in out2[0][0]] == [b"job-b"]


def test_pause_is_recorded_in_the_history_and_the_events(make_queue: Any,
                                                           q: ReliableQueue) -> None:
    hq = make_queue(q.client, f"h-{q.name}", history_max=5, events=True,
                    lua_functions=q.config.lua_functions)
    with hq.events() as events:
        assert hq.pause(by="ops@console")
        assert hq.resume(by="ops@console")
        kinds = [events.get(2.0), events.get(2.0)]
    assert [(e.kind, e.reason) for e in kinds if e] == [("paused", "ops@console"),
                                                          ("resumed", "ops@console")]
    records = hq.history("control")
    assert [(h.outcome, h.reason) for h in records] == [("resumed", "ops@console"),
                                                        ("paused", "ops@console")]
    assert records[0].finished_ms >= records[1].finished_ms > 0


@pytest.mark.parametrize("by", ["x" * 201, "a\nb", 42])
def test_a_bad_by_changes_nothing(q: ReliableQueue, by: Any) -> None:
    q.publish(b"a")
    kept = dumps(q)
    with pytest.raises(ConfigError):
        q.pause(by=by)
    assert dumps(q) == kept
    assert q.stats()["paused"] == 0


def test_the_exporter_shows_the_pause(q: ReliableQueue) -> None:
    pytest.importorskip("prometheus_client")
    from belayq.metrics import QueueCollector

    def paused() -> float:
        [family] = [f for f in QueueCollector(lambda: [q]).collect() if f.name == "belayq_paused"]
        [sample] = family.samples
        return float(sample.value)

    assert paused() == 0
    q.pause()
    assert paused() == 1


def test_a_sharded_queue_pauses_every_shard(q: ReliableQueue) -> None:
    sq = ShardedQueue(q.client, f"s-{q.name}", shards=4, keeper=False,
                      lua_functions=q.config.lua_functions)
    try:
        sq.publish_many([b"a", b"b", b"c", b"d"])
        assert sq.pause() is True
        assert sq.stats()["paused"] == 1
        assert all(s["paused"] == 1 for s in sq.shard_stats().values())
        assert sq.claim(timeout=0.3, count=4) == []
        t, out = in_thread(lambda: sq.claim(timeout=8, count=1))
        time.sleep(0.3)
        resumed = time.monotonic()
        assert sq.resume() is True
        t.join(8)
        [(got, at)] = out
        assert len(got) == 1 and at - resumed < 1.0
        assert sq.stats()["paused"] == 0
    finally:
        sq.close(release=False)
