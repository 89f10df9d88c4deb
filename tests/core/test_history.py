"""The core's opt-in history and events (``history_max``, ``events``): what a finished
message leaves, what goes out on the queue's channel, what stays off by default (nothing
written, nothing published), on Redis 7 (sharded pub/sub), 6.2 (plain pub/sub) and a
cluster (docs/design.md §5.11)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from belayq import ReliableQueue
from belayq.events import Event
from tests.conftest import make_client


@pytest.fixture(params=["redis", "redis62", "cluster"])
def client(request: pytest.FixtureRequest) -> Any:
    c = make_client(request, request.param)
    yield c
    c.close()


def advance(q: ReliableQueue, ms: int) -> None:
    q._scripts.skew_ms += ms


def drain(stream: Any, n: int, timeout: float = 5.0) -> list[Event]:
    got: list[Event] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        event = stream.get(timeout=0.2)
        if event is not None:
            got.append(event)
    return got


def test_off_by_default_writes_and_publishes_nothing(client: Any, make_queue: Any) -> None:
    q = make_queue(client, lease_ms=1_000, max_deliveries=1)
    with q.events() as stream:
        q.publish(b"a")
        q.publish(b"b")
        [d] = q.claim(timeout=0)
        assert q.ack(d, result="ignored")
        [d] = q.claim(timeout=0)
        assert q.nack(d, reason="boom") == "dead"
        assert stream.get(timeout=0.5) is None
    assert not client.exists(q.keys.history_done) and not client.exists(q.keys.history_failed)
    assert q.history("done") == [] and q.history("failed") == []


def test_the_history_keeps_the_last_n_with_results_reasons_and_counts(
    client: Any, make_queue: Any
) -> None:
    q = make_queue(client, lease_ms=1_000, max_deliveries=2, history_max=3,
                   history_ttl_ms=60_000)
    for i in range(5):
        q.publish(f"job-{i}".encode())
    for i in range(5):
        [d] = q.claim(timeout=0)
        assert q.ack(d, result=f"result-{i}")
    done = q.history("done")
    assert [(h.result, h.payload, h.outcome) for h in done] == [
        ("result-4", b"job-4", "done"), ("result-3", b"job-3", "done"),
        ("result-2", b"job-2", "done"),
    ]
    assert all(h.deliveries == 1 and h.attempts == 1 and h.finished_ms > 0 for h in done)
    assert 0 < client.pttl(q.keys.history_done) <= 60_000
    # Dead letters: a nack that used up the runs, and an expired lease that did.
    q.publish(b"\xff\x00binary")
    [d] = q.claim(timeout=0)
    assert q.nack(d, reason="first") == "ready"
    [d] = q.claim(timeout=0)
    assert q.nack(d, reason="second") == "dead"
    q.publish(b"slow")
    for _ in range(2):
        assert len(q.claim(timeout=0)) == 1
        advance(q, 1_001)
    assert q.sweep().dead_lettered == 1
    failed = q.history("failed")
    assert [(h.payload, h.deliveries, h.attempts) for h in failed] == [
        (b"slow", 2, 2), (b"\xff\x00binary", 2, 2)
    ]
    assert failed[0].reason.startswith("lease expired") and failed[1].reason.startswith("second")
    assert failed[0].result == ""


def test_a_long_payload_and_result_are_cut(client: Any, make_queue: Any) -> None:
    q = make_queue(client, history_max=1)
    q.publish(b"x" * 5_000)
    [d] = q.claim(timeout=0)
    assert q.ack(d, result="r" * 5_000)
    [h] = q.history("done")
    assert h.payload == b"x" * 1024 and h.result == "r" * 1024


def test_events_for_every_end_of_a_message(client: Any, make_queue: Any) -> None:
    q = make_queue(client, lease_ms=1_000, max_deliveries=2, events=True)
    with q.events() as stream:
        a = q.publish(b"a")
        [d] = q.claim(timeout=0)
        assert q.ack(d)
        b = q.publish(b"b")
        [d] = q.claim(timeout=0)
        assert q.nack(d, reason="flaky") == "ready"
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        assert q.sweep().dead_lettered == 1  # its second run expired: dead
        c = q.publish(b"c")
        [d] = q.claim(timeout=0)
        advance(q, 1_001)
        assert q.sweep().reclaimed == 1
        got = drain(stream, 4)
    assert [(e.kind, e.id) for e in got] == [
        ("completed", a), ("failed", b), ("dead_lettered", b), ("reclaimed", c)
    ], got
    assert got[1].reason == "flaky" and got[3].reason == "lease expired"
    assert all(e.queue == q.name and e.ms > 0 for e in got)
    assert (got[2].deliveries, got[2].attempts) == (2, 2)


def test_drop_takes_the_history_with_it(client: Any, make_queue: Any) -> None:
    q = make_queue(client, history_max=5)
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    q.ack(d)
    assert client.exists(q.keys.history_done)
    assert q.drop()
    assert not client.exists(q.keys.history_done)


def test_results_must_match_the_claims(client: Any, make_queue: Any) -> None:
    from belayq import ConfigError

    q = make_queue(client, history_max=5)
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    with pytest.raises(ConfigError, match="results"):
        q.ack_many([d], ["one", "two"])
    assert q.ack_many([d], ["one"]) == [True]
