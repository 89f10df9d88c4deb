"""Priority edge cases: mapping onto steps, validation, and keeping the level on every way
back to ready (delayed promotion, nack, release, lease expiry, dead-letter replay)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from belayq import ConfigError, QueueConfig, ReliableQueue

STEPS3 = (0, 1, 2)
STEPS4 = (0, 3, 6, 9)


def _drain(q: ReliableQueue) -> list[Any]:
    """Claim one at a time until empty, acking each; the deliveries in claim order."""
    out = []
    while True:
        got = q.claim(timeout=0)
        if not got:
            return out
        out.append(got[0])
        assert q.ack(got[0])


def _entry(q: ReliableQueue, msg_id: str, payload: bytes) -> bytes:
    """What the ready list holds for a message: its id, or in inline mode the payload."""
    return payload if q.config.payload_in_list else msg_id.encode()


def _level_holding(q: ReliableQueue, entry: bytes) -> list[int]:
    """The 1-based levels whose ready list holds ``entry``."""
    return [i + 1 for i, key in enumerate(q.keys.levels) if entry in q.client.lrange(key, 0, -1)]


@pytest.fixture(params=[False, True], ids=["ids", "inline"])
def payload_in_list(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


# -- mapping onto steps --------------------------------------------------------------------


def test_level_of_is_the_largest_step_not_above(r, make_queue):
    q = make_queue(r, priority_steps=STEPS4)
    got = {p: q.level_of(p) for p in range(10)}
    assert got == {0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 3, 7: 3, 8: 3, 9: 4}
    for above in (10, 10**9):  # above the last step: refused, never silently folded in
        with pytest.raises(ConfigError, match=r"within 0\.\.9"):
            q.level_of(above)
    # Below the first step: the highest level.
    q2 = make_queue(r, name=q.name + "-b", priority_steps=(2, 5))
    assert [q2.level_of(p) for p in range(6)] == [1, 1, 1, 1, 1, 2]


def test_priority_five_goes_to_the_level_of_step_three(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS4)
    mid = q.publish(b"five", priority=5)
    assert _level_holding(q, mid.encode()) == [2]
    # Its level is step 3's: FIFO with priority 3, after 0..2, before 6..
    p9 = q.publish(b"nine", priority=9)
    p3 = q.publish(b"three", priority=3)
    p6 = q.publish(b"six", priority=6)
    p0 = q.publish(b"zero", priority=0)
    p4 = q.publish(b"four", priority=4)
    with pytest.raises(ConfigError, match="priority"):
        q.publish(b"hundred", priority=100)
    assert [d.id for d in _drain(q)] == [p0, mid, p3, p4, p6, p9]


def test_default_queue_honours_priorities_0_to_9(any_client, make_queue):
    q = make_queue(any_client)  # defaults: priority_steps 0..9, one level each
    order = (5, 0, 9, 1, 5, 0, 3, 9)
    ids = [q.publish(f"m{i}-{p}", priority=p) for i, p in enumerate(order)]
    by_priority = [i for _, i in sorted(zip(order, ids, strict=True), key=lambda x: x[0])]
    assert [d.id for d in _drain(q)] == by_priority  # lowest first, FIFO within a priority
    for bad in (10, -1):
        with pytest.raises(ConfigError, match=r"within 0\.\.9"):
            q.publish(b"x", priority=bad)


def test_one_step_refuses_other_priorities(any_client, make_queue):
    q = make_queue(any_client, priority_steps=(0,))
    with pytest.raises(ConfigError, match=r"within 0\.\.0"):
        q.publish(b"x", priority=5)
    assert q.stats()["ready"] == 0


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -100, 1.0, 1.5, "1", None, True, False])
def test_bad_priority_raises_config_error_and_stores_nothing(r, make_queue, bad):
    q = make_queue(r, priority_steps=STEPS3)
    with pytest.raises(ConfigError, match="priority"):
        q.publish(b"x", priority=bad)
    with pytest.raises(ConfigError, match="priority"):
        q.publish(b"x", priority=bad, delay_ms=1000)
    with pytest.raises(ConfigError, match="priority"):
        q.publish_many([b"a", b"b"], priority=bad)
    with pytest.raises(ConfigError):
        q.level_of(bad)
    s = q.stats()
    assert (s["ready"], s["delayed"], s.get("published", 0)) == (0, 0, 0)


def test_negative_priority_is_a_value_error_too(r, make_queue):
    q = make_queue(r)
    with pytest.raises(ValueError, match="within 0"):
        q.publish(b"x", priority=-1)


@pytest.mark.parametrize(
    "steps", [(), (-1, 0), (0, 0), (3, 1), (0, 2, 1), (0, 1.5), ("0",)], ids=repr
)
def test_bad_priority_steps_raise(steps):
    with pytest.raises(ConfigError, match="priority_steps"):
        QueueConfig(priority_steps=steps)


@pytest.mark.parametrize("floor", [-0.1, 0.51, 1.0])
def test_starvation_floor_out_of_range_raises(floor):
    with pytest.raises(ConfigError, match="starvation_floor"):
        QueueConfig(starvation_floor=floor)


def test_floor_every(r):
    assert QueueConfig().floor_every == 0
    assert QueueConfig(starvation_floor=0.1).floor_every == 10
    assert QueueConfig(starvation_floor=0.5).floor_every == 2
    assert QueueConfig(starvation_floor=0.01).floor_every == 100
    assert QueueConfig(priority_steps=[0, 5]).priority_steps == (0, 5)


# -- the level survives every way back to ready --------------------------------------------


def test_delayed_messages_keep_their_priority_when_promoted(
    any_client, make_queue, payload_in_list
):
    q = make_queue(any_client, priority_steps=STEPS3, payload_in_list=payload_in_list)
    d2 = q.publish(b"delayed-p2", priority=2, delay_ms=60_000)
    d0 = q.publish(b"delayed-p0", priority=0, delay_ms=60_000)
    e2 = q.publish(b"ready-p2", priority=2)
    b1 = q.publish(b"ready-p1", priority=1)
    assert q.stats()["delayed"] == 2
    assert [d.id for d in _drain(q)] == [b1, e2]  # the delayed ones are not due
    e2 = q.publish(b"ready-p2-again", priority=2)
    b1 = q.publish(b"ready-p1-again", priority=1)

    q._scripts.skew_ms = 61_000  # move this queue's clock past the due time
    res = q.sweep()
    assert res.promoted == 2
    assert _level_holding(q, _entry(q, d2, b"delayed-p2")) == [3]
    assert _level_holding(q, _entry(q, d0, b"delayed-p0")) == [1]
    got = _drain(q)
    # Promoted to the back of its own level: p0 first, then p1, then the p2 published
    # before it was due, then it.
    assert [d.id for d in got] == [d0, b1, e2, d2]
    assert got[0].payload == b"delayed-p0"
    s = q.stats()
    assert (s["ready"], s["delayed"], s["in_flight"]) == (0, 0, 0)


def test_delayed_low_priority_message_reaches_a_waiting_claimer(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS3)
    msg = q.publish(b"later", priority=2, delay_ms=300)
    t0 = time.monotonic()
    got = q.claim(timeout=5)
    print(
        f"\nclaim returned the delayed p2 message after {time.monotonic() - t0:.2f} s "
        "(due after 0.3 s)"
    )
    assert [d.id for d in got] == [msg]
    assert q.ack(got[0])


def test_nack_requeues_to_the_front_of_its_own_level(any_client, make_queue, payload_in_list):
    q = make_queue(any_client, priority_steps=STEPS3, payload_in_list=payload_in_list)
    a = q.publish(b"a-p1", priority=1)
    b = q.publish(b"b-p1", priority=1)
    c = q.publish(b"c-p2", priority=2)
    [first] = q.claim(timeout=0)
    assert first.id == a
    assert q.nack(first, reason="boom") == "ready"
    assert _level_holding(q, _entry(q, a, b"a-p1")) == [2]
    x = q.publish(b"x-p0", priority=0)
    y = q.publish(b"y-p1", priority=1)
    got = _drain(q)
    # Front of level 2 (before b, which was published earlier), yet behind new p0 work.
    assert [d.id for d in got] == [x, a, b, y, c]
    assert got[1].deliveries == 2
    assert got[1].payload == b"a-p1"


def test_nack_with_delay_comes_back_to_its_own_level(any_client, make_queue, payload_in_list):
    q = make_queue(any_client, priority_steps=STEPS3, payload_in_list=payload_in_list)
    c = q.publish(b"c-p2", priority=2)
    [d] = q.claim(timeout=0)
    assert q.nack(d, delay_ms=30_000) == "delayed"
    b = q.publish(b"b-p1", priority=1)
    e = q.publish(b"e-p2", priority=2)
    q._scripts.skew_ms = 31_000
    got = _drain(q)
    assert [x.id for x in got] == [b, e, c]
    assert got[2].deliveries == 2


def test_release_and_expired_leases_go_to_the_front_of_their_own_level(
    any_client, make_queue, payload_in_list
):
    q = make_queue(
        any_client, priority_steps=STEPS3, payload_in_list=payload_in_list, lease_ms=1_000
    )
    ids = {p: q.publish(p, priority=int(p[1:2])) for p in (b"p2-a", b"p2-b", b"p1-a", b"p1-b")}
    held = q.claim(timeout=0, count=3)  # p1-a, p1-b, p2-a
    assert [d.id for d in held] == [ids[b"p1-a"], ids[b"p1-b"], ids[b"p2-a"]]
    # p1-b is released (clean shutdown); the other two are left to expire.
    assert q.release([held[1]]) == 1
    q._scripts.skew_ms = 5_000
    res = q.sweep()
    assert res.reclaimed == 2
    got = _drain(q)
    assert [d.id for d in got] == [ids[b"p1-a"], ids[b"p1-b"], ids[b"p2-a"], ids[b"p2-b"]]
    assert [d.deliveries for d in got] == [2, 1, 2, 1]  # a release does not count


def test_replayed_dead_letters_keep_their_priority(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS3, max_deliveries=1)
    dead = q.publish(b"poison-p2", priority=2)
    [d] = q.claim(timeout=0)
    assert q.nack(d, reason="bad") == "dead"
    p1 = q.publish(b"p1", priority=1)
    p2 = q.publish(b"p2", priority=2)
    assert q.replay_dead() == 1
    assert [d.id for d in _drain(q)] == [p1, p2, dead]


def test_nack_of_a_low_priority_message_wakes_a_blocked_claimer(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS3)
    q.publish(b"p2", priority=2)
    [d] = q.claim(timeout=0)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(got=q.claim(timeout=3)), daemon=True)
    thread.start()
    time.sleep(0.3)  # blocked in BLMOVE on an empty level 1
    assert q.nack(d) == "ready"
    thread.join(10)
    assert [x.id for x in result["got"]] == [d.id]
    assert result["got"][0].deliveries == 2


def test_ready_count_ignores_the_bell(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS3)
    q.publish(b"only-p2", priority=2)
    # Level 1 holds the bell, which is not a message.
    assert q.client.llen(q.keys.levels[0]) == 1
    assert q.stats()["ready"] == 1
    assert q.purge() == 1
    assert q.stats()["ready"] == 0


@pytest.mark.parametrize("how", ["publish", "nack", "sweep", "release"])
def test_bell_off_never_puts_an_entry_a_stock_consumer_cannot_decode(
    any_client, make_queue, payload_in_list, how
):
    """bell=False: level 1 only ever holds messages, whatever way work reaches level 2."""
    q = make_queue(any_client, priority_steps=STEPS3, bell=False, payload_in_list=payload_in_list,
                   lease_ms=100)
    msg = q.publish(b"p2", priority=2)
    if how != "publish":
        [d] = q.claim(timeout=0)
        if how == "nack":
            assert q.nack(d) == "ready"
        elif how == "release":
            assert q.release([d]) == 1
        else:
            q.forget([d])  # its consumer died
            time.sleep(0.25)
            q.sweep()
    assert q.client.llen(q.keys.levels[0]) == 0
    assert q.client.llen(q.keys.levels[2]) == 1
    assert [d.id for d in q.claim(timeout=0)] == [msg]


def test_bell_off_blocked_claimer_finds_lower_levels_within_a_sweep_period(
    any_client, make_queue
):
    q = make_queue(any_client, priority_steps=STEPS3, bell=False, sweep_interval_ms=300)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(got=q.claim(timeout=5)), daemon=True)
    thread.start()
    time.sleep(0.1)  # blocked in BLMOVE on an empty level 1
    t0 = time.monotonic()
    msg = q.publish(b"p2", priority=2)
    thread.join(10)
    waited = time.monotonic() - t0
    print(f"\nbell off: blocked claimer got a level-2 message after {waited:.2f} s")
    assert [x.id for x in result["got"]] == [msg]
    assert q.client.llen(q.keys.levels[0]) == 0


def test_bell_must_be_a_bool():
    with pytest.raises(ConfigError, match="bell"):
        QueueConfig(bell="no")  # type: ignore[arg-type]


# -- the starvation floor with more than two levels ----------------------------------------


def test_floor_serves_the_lowest_non_empty_level(any_client, make_queue):
    """Every 2nd claim (floor 0.5) goes to the lowest non-empty level: bulk first, then
    the middle level once bulk is empty; the other claims are strict priority."""
    q = make_queue(any_client, priority_steps=(0, 5, 9), starvation_floor=0.5)
    q.publish_many([f"u{i}" for i in range(10)], priority=0)
    q.publish_many([f"m{i}" for i in range(3)], priority=5)
    q.publish_many([f"b{i}" for i in range(2)], priority=9)
    seq = [d.payload.decode() for d in _drain(q)]
    floor_picks = [p for p in seq if p[0] != "u"]
    assert floor_picks == ["b0", "b1", "m0", "m1", "m2"]
    urgent = [p for p in seq if p[0] == "u"]
    assert urgent == [f"u{i}" for i in range(10)]
    # Interleaved, not bunched: the 5 floor picks come before the last urgent claim.
    assert seq.index("m2") < seq.index("u9")


def test_floor_with_count_takes_its_share_inside_a_batch(r, make_queue):
    q = make_queue(r, priority_steps=(0, 9), starvation_floor=0.1)
    q.publish_many([b"u"] * 100, priority=0)
    q.publish_many([b"b"] * 100, priority=9)
    got = q.claim(timeout=0, count=50)
    assert len(got) == 50
    assert sum(d.payload == b"b" for d in got) == 5
    assert all(q.ack_many(got))


def test_floor_turn_with_no_bulk_falls_back_to_priority(r, make_queue):
    q = make_queue(r, priority_steps=(0, 9), starvation_floor=0.5)
    ids = q.publish_many([f"u{i}" for i in range(6)], priority=0)
    assert [d.id for d in _drain(q)] == ids  # no claim is lost to an empty bulk level
