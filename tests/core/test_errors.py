"""Honest errors (docs/design.md §2.8): each bad setup fails at construction with one clear
message."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from belayq import ConfigError, CrossSlot, RedisTooOld, ReliableQueue, SchemaMismatch
from belayq.errors import ConnectionLost
from tests.conftest import make_client


class OldRedis(redis.Redis):
    """A real connection whose server claims to be Redis 6.0 (we have no 6.0 binary)."""

    def info(self, section: Any = None, *args: Any, **kwargs: Any) -> Any:
        return {"redis_version": "6.0.16"}


def test_redis_older_than_6_2_fails_fast(redis_server: Any, qname: str) -> None:
    with pytest.raises(RedisTooOld, match=r"6\.2 or newer.*6\.0\.16"):
        ReliableQueue(OldRedis(port=redis_server.port), qname)


def test_redis_6_2_is_accepted(request: pytest.FixtureRequest, qname: str) -> None:
    client = make_client(request, "redis62")
    assert client.info()["redis_version"].startswith("6.2")
    ReliableQueue(client, qname, keeper=False)


def test_schema_mismatch(r: redis.Redis, qname: str) -> None:
    q = ReliableQueue(r, qname, keeper=False)
    r.hset(q.keys.stats, "schema", 99)
    with pytest.raises(SchemaMismatch, match="schema 99"):
        ReliableQueue(r, qname, keeper=False)


def test_decode_responses_refused(redis_server: Any, qname: str) -> None:
    with pytest.raises(ConfigError, match="decode_responses=False"):
        ReliableQueue(redis.Redis(port=redis_server.port, decode_responses=True), qname)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lease_secs": 3}, "unknown ReliableQueue option"),
        ({"lease_ms": 5}, "lease_ms must be an int >= 100"),
        ({"lease_ms": 1000, "heartbeat_interval_ms": 1000}, "must be shorter than lease_ms"),
        ({"priority_steps": (3, 1)}, "strictly increasing"),
        ({"starvation_floor": 0.9}, "starvation_floor"),
        ({"max_deliveries": 0}, "max_deliveries"),
        ({"prefix": "a{b}"}, "braces"),
    ],
)
def test_bad_options(r: redis.Redis, qname: str, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ReliableQueue(r, qname, **options)


def test_bad_call_arguments(r: redis.Redis, qname: str) -> None:
    q = ReliableQueue(r, qname, keeper=False)
    with pytest.raises(ConfigError, match="priority"):
        q.publish(b"x", priority=-1)
    with pytest.raises(ConfigError, match="delay_ms"):
        q.publish(b"x", delay_ms=-5)
    with pytest.raises(ConfigError, match="payload"):
        q.publish(123)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="count"):
        q.claim(timeout=0, count=0)
    assert q.stats()["ready"] == 0


def test_queue_name_with_braces_refused(r: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="braces"):
        ReliableQueue(r, "a{b}")


def test_cross_slot_layout_refused_on_a_cluster(request: pytest.FixtureRequest) -> None:
    cluster = make_client(request, "cluster")
    with pytest.raises(CrossSlot, match="more than one Redis Cluster slot"):
        ReliableQueue(
            cluster,
            "celery",
            ready_key="celery",
            level_keys=["celery\x06\x163"],
            priority_steps=(0, 3),
        )
    # The same stock layout works on a single Redis, where slots do not matter.
    single = make_client(request, "redis")
    ReliableQueue(
        single,
        "celery",
        ready_key="celery",
        level_keys=["celery\x06\x163"],
        priority_steps=(0, 3),
        payload_in_list=True,
        keeper=False,
    )


def test_adopted_untagged_ready_key_stays_on_one_slot(request: pytest.FixtureRequest) -> None:
    cluster = make_client(request, "cluster")
    q = ReliableQueue(
        cluster, "default", ready_key="rq:queue:default", payload_in_list=True, keeper=False
    )
    assert q.keys.processing == "{rq:queue:default}:processing"
    cluster.lpush("rq:queue:default", b"job-1")
    [d] = q.claim(timeout=0)
    assert d.payload == b"job-1" and q.ack(d)


def test_unreachable_redis_is_connection_lost(qname: str) -> None:
    from belayq.embedded import free_port

    with pytest.raises(ConnectionLost, match="Redis unreachable"):
        ReliableQueue(redis.Redis(port=free_port(), socket_connect_timeout=0.5), qname)


def test_long_blocking_claim_stays_inside_the_socket_timeout(redis_server: Any, qname: str) -> None:
    """A from_url() pool names no socket_timeout, yet its connections read with redis-py's
    5 s default: a claim waiting longer must block in slices, not time the socket out."""
    q = ReliableQueue(redis.Redis.from_url(redis_server.url), qname, keeper=False)
    assert q.claim(timeout=5.5) == []
