"""``dead_letter(..., runs_before=, payload=)``: a framework that retries by sending a new
message (Dramatiq) dead-letters the last one with the runs of the earlier ones, and with the
payload a replay should deliver (its retry count reset). Bad values change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from belayq import ConfigError, ReliableQueue


def test_a_dead_letter_counts_the_runs_of_earlier_ids_and_keeps_the_payload_given(
    q: ReliableQueue,
) -> None:
    q.publish(b"retries=2")
    [d] = q.claim(timeout=1)
    assert q.dead_letter(d, "gave up", runs_before=2, payload=b"retries=0")
    [dead] = q.dead_letters()
    assert (dead.deliveries, dead.attempts, dead.reason) == (3, 3, "gave up")
    assert dead.payload == b"retries=0"
    # a replay delivers the payload the dead letter kept, with fresh counts
    assert q.replay_dead() == 1
    [again] = q.claim(timeout=1)
    assert (again.payload, again.deliveries) == (b"retries=0", 1)


def test_a_plain_dead_letter_is_as_before(q: ReliableQueue) -> None:
    q.publish(b"m")
    [d] = q.claim(timeout=1)
    assert q.dead_letter(d, "bad")
    [dead] = q.dead_letters()
    assert (dead.deliveries, dead.attempts, dead.payload) == (1, 1, b"m")


@pytest.mark.parametrize("kwargs", [{"runs_before": -1}, {"runs_before": "2"},
                                    {"payload": b""}, {"payload": "text"}])
def test_a_bad_dead_letter_argument_changes_nothing(q: ReliableQueue, kwargs: Any) -> None:
    q.publish(b"m")
    [d] = q.claim(timeout=1)
    with pytest.raises(ConfigError):
        q.dead_letter(d, "bad", **kwargs)
    assert q.stats()["in_flight"] == 1 and q.dead_letters() == []
    assert q.ack(d)


def test_a_payload_is_refused_where_the_entry_is_the_payload(make_queue: Any,
                                                             client: Any) -> None:
    q = make_queue(client, payload_in_list=True)
    q.publish(b"m")
    [d] = q.claim(timeout=1)
    with pytest.raises(ConfigError, match="payload_in_list"):
        q.dead_letter(d, "bad", payload=b"other")
    assert q.dead_letters() == [] and q.ack(d)
