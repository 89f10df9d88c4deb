"""``wait_replicas=1`` on a primary that has no replica (as a promoted replica has none
until one rejoins): every durable call raises ``DurabilityError`` after ``wait_timeout_ms``
and never hangs, yet its write is applied; a settle that raised is not held again (so the
keeper does not report its lease lost), and the lease keeper's beat still sweeps."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from belayq import DurabilityError, ReliableQueue
from belayq.embedded import RedisServer
from belayq.keeper import KEEPER
from tests.conftest import client_of

WAIT_MS = 100


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    with client_of(redis_server) as c:
        yield c
    KEEPER.stop_all()


def queue(client: redis.Redis, **options: object) -> ReliableQueue:
    return ReliableQueue(
        client,
        f"norep-{uuid.uuid4().hex[:8]}",
        wait_replicas=1,
        wait_timeout_ms=WAIT_MS,
        keeper=False,
        **options,
    )


def refused(call: object) -> str:
    t0 = time.monotonic()
    with pytest.raises(DurabilityError) as info:
        call()  # type: ignore[operator]
    assert time.monotonic() - t0 < WAIT_MS / 1000 + 2, "a refused durable call hung"
    return str(info.value)


def test_writes_apply_and_raise(client: redis.Redis) -> None:
    q = queue(client)
    said = refused(lambda: q.publish(b"m"))
    assert "0 of 1 replica(s)" in said and "0 replica(s) connected" in said, said
    assert q.stats()["ready"] == 1  # the publish is there
    [d] = q.claim(timeout=1)  # claims never wait for replicas
    refused(lambda: q.ack(d))
    assert q.held == [], "a settle that ran must not be held (and extended) again"
    assert q.stats()["in_flight"] == 0 and q.claim(timeout=0) == []


def test_the_keepers_beat_still_sweeps(client: redis.Redis) -> None:
    q = queue(client, lease_ms=200, heartbeat_interval_ms=50)
    other = ReliableQueue(client, q.name, lease_ms=200, keeper=False)
    for payload in (b"held", b"lost"):
        refused(lambda p=payload: q.publish(p))  # type: ignore[misc]
    [held] = q.claim(timeout=1)
    [lost] = other.claim(timeout=1)  # its holder vanishes: never extended
    time.sleep(0.3)
    q.heartbeat()  # the extend of `held` raises DurabilityError; the sweep must still run
    assert q.held == [held]
    back = q.claim(timeout=1)
    assert [d.id for d in back] == [lost.id], "the lost claim was not swept back"
