"""Every call checks its arguments before it changes anything: the Python side raises
ConfigError before it sends a command, and each script checks what it receives before its
first write (a failed check is a ``BELAYQ bad argument`` error reply, mapped to ConfigError),
so a bad argument leaves the queue exactly as it was. On Redis 7.0 (functions and scripts)
and 6.2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from belayq import ConfigError, Delivery, ReliableQueue
from belayq.errors import redis_errors, script_error
from tests.support import key_picture


def snapshot(q: ReliableQueue) -> dict[str, Any]:
    return {k: key_picture(q.client, k) for k in q.keys.all_keys()}


def held_claim(q: ReliableQueue) -> Delivery:
    """A queue with a ready, a delayed, a dead and an in-flight message; the claim."""
    q.publish(b"dead")
    [d] = q.claim(timeout=0)
    assert q.dead_letter(d, "bad")
    q.publish(b"held")
    [held] = q.claim(timeout=0)
    q.publish(b"ready")
    q.publish(b"later", delay_ms=600_000)
    return held


def test_nack_with_a_bad_delay_raises_config_error_and_the_claim_stays_held(
    q: ReliableQueue,
) -> None:
    d = held_claim(q)
    before = snapshot(q)
    with pytest.raises(ConfigError, match="delay_ms"):
        q.nack(d, delay_ms="5s")  # type: ignore[arg-type]
    assert snapshot(q) == before
    assert q.held == [d]
    assert q.ack(d) is True
    assert q.stats()["in_flight"] == 0


class Unreachable:
    """A client that fails the test if any command is sent through it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a command was sent ({name}) for a bad argument")


def _no_delivery(q: ReliableQueue, d: Delivery) -> Delivery:
    return Delivery(id=d.id, payload=d.payload, token="", deliveries=1, queue=d.queue)


BAD_CALLS: dict[str, Callable[[ReliableQueue, Delivery], Any]] = {
    "nack-delay-text": lambda q, d: q.nack(d, delay_ms="5s"),
    "nack-delay-negative": lambda q, d: q.nack(d, delay_ms=-1),
    "nack-delay-bool": lambda q, d: q.nack(d, delay_ms=True),
    "nack-delay-huge": lambda q, d: q.nack(d, delay_ms=10**16),
    "nack-reason-not-text": lambda q, d: q.nack(d, reason=5),
    "nack-not-a-delivery": lambda q, d: q.nack(d.id),
    "nack-empty-token": lambda q, d: q.nack(_no_delivery(q, d)),
    "dead-letter-reason-none": lambda q, d: q.dead_letter(d, None),
    "ack-not-a-delivery": lambda q, d: q.ack(d.id),
    "ack-many-a-string": lambda q, d: q.ack_many(d.id),
    "ack-many-results-mismatch": lambda q, d: q.ack_many([d], ["a", "b"]),
    "ack-result-not-text": lambda q, d: q.ack(d, 5),
    "extend-not-deliveries": lambda q, d: q.extend([d, "x"]),
    "release-not-deliveries": lambda q, d: q.release([d.id]),
    "defer-delay-text": lambda q, d: q.defer([(d, "1")]),
    "defer-delay-negative": lambda q, d: q.defer([(d, -5)]),
    "defer-not-pairs": lambda q, d: q.defer([d]),
    "replay-limit-zero": lambda q, d: q.replay_dead(limit=0),
    "replay-limit-text": lambda q, d: q.replay_dead(limit="10"),
    "replay-empty-id": lambda q, d: q.replay_dead([""]),
    "replay-one-string": lambda q, d: q.replay_dead("abc"),
    "purge-on-batch-not-callable": lambda q, d: q.purge(on_batch=5),
    "publish-delay-text": lambda q, d: q.publish(b"x", delay_ms="1"),
    "publish-priority-out-of-range": lambda q, d: q.publish(b"x", priority=99),
    "publish-empty-dedup": lambda q, d: q.publish(b"x", dedup_id=""),
}


@pytest.mark.parametrize("call", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_a_bad_argument_raises_config_error_before_any_command(
    q: ReliableQueue, call: Callable[[ReliableQueue, Delivery], Any]
) -> None:
    d = held_claim(q)
    client = q.client
    q.client = q._scripts.client = Unreachable()
    try:
        with pytest.raises(ConfigError):
            call(q, d)
    finally:
        q.client = q._scripts.client = client
    assert q.held == [d] and q.ack(d) is True


#: Arguments each script refuses (after the common ones), and what the error names.
BAD_SCRIPT_ARGS: list[tuple[str, list[Any], str]] = [
    ("publish", ["x", "id1", b"p", 1, 0, ""], "dedup_window_ms"),
    ("publish", [1000, "id1", b"p", 1, 0], "groups of 5"),
    ("publish", [1000, "id1", b"p", 0, 0, ""], "level"),
    ("publish", [1000, "id1", b"p", 11, 0, ""], "level"),
    ("publish", [1000, "id1", b"p", 1, -1, ""], "delay_ms"),
    ("publish", [1000, "", b"p", 1, 0, ""], "id"),
    ("publish", [1000], "groups of 5"),
    ("claim", [0, 1, 0, 10, "n", "1"], "lease_ms"),
    ("claim", [1000, "1.5", 0, 10, "n", "1"], "count"),
    ("claim", [1000, 1, -1, 10, "n", "1"], "floor_every"),
    ("claim", [1000, 1, 0, 0, "n", "1"], "sweep_limit"),
    ("claim", [1000, 1, 0, 10, "", "1"], "nonce"),
    ("claim", [1000, 1, 0, 10, "n", "2"], "starts"),
    ("claim", [1000, 1, 0, 10, "n"], "arguments"),
    ("claim", [1000, 1, 0, 10, "n", "1", "extra"], "arguments"),
    ("lease", [1000, 1, 0, 10, "n", "1"], "arguments"),
    ("ack", ["x", "id", "tok"], "results"),
    ("ack", ["0"], "groups of 2"),
    ("ack", ["0", "id"], "groups of 2"),
    ("ack", ["1", "id", "tok"], "groups of 3"),
    ("ack", ["0", "", "tok"], "id"),
    ("nack", ["ID", "TOKEN", "5s", "", "0"], "delay_ms"),
    ("nack", ["ID", "TOKEN", 0, "", "yes"], "bury"),
    ("nack", ["ID", "TOKEN", 0, ""], "arguments"),
    ("nack", ["ID", "", 0, "", "0"], "token"),
    ("extend", ["abc", "1", "ID", "TOKEN", "0"], "lease_ms"),
    ("extend", [1000, "x", "ID", "TOKEN", "0"], "count_stale"),
    ("extend", [1000, "1", "ID", "TOKEN", "2"], "start"),
    ("extend", [1000, "1", "ID", "TOKEN"], "groups of 3"),
    ("release", ["ID"], "groups of 2"),
    ("release", ["ID", ""], "token"),
    ("release", [], "groups of 2"),
    ("defer", ["ID", "TOKEN", -5], "delay_ms"),
    ("defer", ["ID", "TOKEN"], "groups of 3"),
    ("sweep", [0, 1000], "limit"),
    ("sweep", [10, "x"], "grace_ms"),
    ("sweep", [10, 1000, 1], "arguments"),
    ("replay", [0, "0"], "limit"),
    ("discard", [0], "limit"),
    ("discard", [10, ""], "id"),
    ("replay", [10, "0", ""], "id"),
    ("purge", ["-1", "1", "0"], "limit"),
    ("purge", [10, "2", "0"], "delayed"),
    ("purge", [10, "1", "x"], "entries"),
    ("purge", [10, "1"], "arguments"),
    ("promote", [0], "limit"),
    ("promote", [10, 1], "arguments"),
    ("drop", ["extra"], "arguments"),
    ("stats", ["extra"], "arguments"),
]


@pytest.mark.parametrize(
    ("name", "args", "named"), BAD_SCRIPT_ARGS,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_SCRIPT_ARGS)],
)
def test_a_script_refuses_a_bad_argument_before_its_first_write(
    q: ReliableQueue, name: str, args: list[Any], named: str
) -> None:
    d = held_claim(q)
    args = [d.id if a == "ID" else d.token if a == "TOKEN" else a for a in args]
    before = snapshot(q)
    with pytest.raises(redis.ResponseError, match=f"BELAYQ bad argument: .*{named}"):
        q._scripts.run(name, *args)
    assert snapshot(q) == before
    assert q.ack(d) is True


@pytest.mark.parametrize(
    ("index", "value", "named"),
    [(0, "x", "skew_ms"), (1, "2", "mode"), (1, "0Q", "mode"), (1, "0H0,5", "mode"),
     (2, 0, "max_deliveries"), (3, "", "dead_max"), (5, -1, "reply_window_ms")],
)
def test_a_script_refuses_bad_common_arguments(
    q: ReliableQueue, index: int, value: Any, named: str
) -> None:
    d = held_claim(q)
    command = q._scripts._command("ack", ["0", d.id, d.token], "")
    first = 3 + len(q._scripts.vectors["ack"])  # verb, target, key count, keys
    command[first + index] = value
    before = snapshot(q)
    with pytest.raises(redis.ResponseError, match=f"BELAYQ bad argument: .*{named}"):
        q.client.execute_command(*command)
    assert snapshot(q) == before


def test_a_script_refuses_a_wrong_key_vector(q: ReliableQueue) -> None:
    d = held_claim(q)
    command = q._scripts._command("ack", ["0", d.id, d.token], "")
    named = len(q._scripts.vectors["ack"])
    del command[3]  # one key fewer than the contract block names
    command[2] = int(command[2]) - 1
    before = snapshot(q)
    with pytest.raises(redis.ResponseError,
                       match=f"BELAYQ bad argument: expected {named} keys, got {named - 1}"):
        q.client.execute_command(*command)
    assert snapshot(q) == before


def test_a_script_error_reply_becomes_config_error_at_the_boundary(q: ReliableQueue) -> None:
    d = held_claim(q)

    @redis_errors
    def run(name: str, *args: Any) -> Any:
        return q._scripts.run(name, *args)

    with pytest.raises(ConfigError, match=r"^delay_ms \(ARGV\[9\]\) must be an integer"):
        run("nack", d.id, d.token, "5s", "", "0")
    assert q.ack(d) is True


@pytest.mark.parametrize("text", [
    "BELAYQ bad argument: delay_ms (ARGV[9]) must be an integer, got \"5s\" script: "
    "belayq_0123456789ab_nack, on @user_function:42.",
    "Error running script (call to f_0123): @user_script:1: BELAYQ bad argument: delay_ms "
    "(ARGV[9]) must be an integer, got \"5s\"",
    "BELAYQ bad argument: delay_ms (ARGV[9]) must be an integer, got \"5s\" script: on "
    "@user_script:1.",
])
def test_script_error_reads_every_server_s_form(text: str) -> None:
    mapped = script_error(redis.ResponseError(text))
    assert isinstance(mapped, ConfigError)
    assert str(mapped) == 'delay_ms (ARGV[9]) must be an integer, got "5s"'
    assert script_error(redis.ResponseError("ERR something else")) is None
