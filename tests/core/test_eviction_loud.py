"""A server that may evict queue data says so on every surface: a line from every command
(on stderr for ``belayq queues``), the dashboard's banner (its overview's ``eviction``), and
the exporter's ``belayq_eviction_possible`` gauge; each points to the docs site, which a pip
user can reach. The policy is read at each request, by CONFIG GET, or by INFO memory where
CONFIG is refused. A server with no memory limit never evicts, whatever its policy, and is
not warned about."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.eviction import of
from belayq.metrics import QueueCollector
from belayq.site import docs_url
from tests.conftest import any_binary
from tests.core.conftest import run

PASSWORD = "eviction-pw"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A server of this module's own: its policy is changed by the tests."""
    with RedisServer(any_binary(), args=["--maxmemory-policy", "noeviction"]) as s:
        yield s


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=server.port)
    c.flushall()
    c.config_set("maxmemory-policy", "noeviction")
    c.config_set("maxmemory", "1gb")  # a limit: the policy applies
    yield c
    c.config_set("maxmemory-policy", "noeviction")
    c.close()


def url(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


def gauge(client: redis.Redis, queues: list[Any]) -> list[tuple[dict[str, str], float]]:
    [family] = [f for f in QueueCollector(lambda: queues, client=client).collect()
                if f.name == "belayq_eviction_possible"]
    return [(s.labels, s.value) for s in family.samples]


def test_every_tool_says_queue_data_can_vanish_under_allkeys(
        client: redis.Redis, server: RedisServer, capsys: Any) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish(b"x")
    client.config_set("maxmemory-policy", "allkeys-lru")
    site = docs_url()
    code, out, err = run(capsys, "queues", "--url", url(server))
    assert code == 0 and "jobs" in out
    assert "maxmemory-policy is allkeys-lru" in err and site in err and "vanish" in err
    code, out, err = run(capsys, "stats", "--url", url(server), "jobs")
    assert code == 0 and "maxmemory-policy is allkeys-lru" in out.splitlines()[-1]
    code, out, err = run(capsys, "stats", "--url", url(server), "jobs", "--json")
    assert json.loads(out)["ready"] == 1 and "allkeys-lru" in err  # stdout stays JSON
    code, out, err = run(capsys, "watch", "--url", url(server), "--count", "1", "--json")
    assert json.loads(out)["eviction"].startswith("warning: Redis maxmemory-policy")
    # The registry evicted: no queue is known, and the line says why that may be.
    client.delete("belayq:queues")
    code, out, err = run(capsys, "queues", "--url", url(server))
    assert code == 0 and "no queues known" in out + err and "allkeys-lru" in err
    code, out, err = run(capsys, "stats", "--url", url(server), "gone")
    assert code == 2 and "gone" in err and "allkeys-lru" in err  # the error says why too
    assert gauge(client, []) == [({"policy": "allkeys-lru", "evicts": "any key"}, 1.0)]
    client.config_set("maxmemory-policy", "noeviction")  # read again at each request
    code, out, err = run(capsys, "stats", "--url", url(server), "jobs")
    assert code == 0 and "maxmemory-policy" not in out + err
    assert gauge(client, [q]) == [({"policy": "noeviction", "evicts": "nothing"}, 0.0)]


def test_a_volatile_policy_says_keys_with_a_ttl_can_vanish(
        client: redis.Redis, server: RedisServer, capsys: Any) -> None:
    ReliableQueue(client, "jobs", keeper=False).publish(b"x")
    client.config_set("maxmemory-policy", "volatile-lru")
    code, out, err = run(capsys, "stats", "--url", url(server), "jobs")
    assert code == 0 and "volatile-lru" in out and "keys with a TTL" in out
    assert gauge(client, []) == [({"policy": "volatile-lru", "evicts": "keys with a TTL"},
                                  1.0)]


def test_the_policy_is_read_from_info_where_config_is_refused(
        client: redis.Redis, server: RedisServer, capsys: Any) -> None:
    client.config_set("maxmemory-policy", "allkeys-lfu")
    client.execute_command("ACL", "SETUSER", "noconfig", "on", f">{PASSWORD}", "~*", "&*",
                           "+@all", "-config")
    try:
        limited = redis.Redis(port=server.port, username="noconfig", password=PASSWORD)
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.config_get("maxmemory-policy")
        found = of(limited)
        assert found is not None and found.policy == "allkeys-lfu" and found.any_key
        sent = f"redis://noconfig:{PASSWORD}@127.0.0.1:{server.port}/0"
        ReliableQueue(client, "jobs", keeper=False).publish(b"x")
        code, _, err = run(capsys, "queues", "--url", sent)
        assert code == 0 and "allkeys-lfu" in err
        limited.close()
    finally:
        client.execute_command("ACL", "DELUSER", "noconfig")


def test_the_dashboard_overview_carries_the_warning(
        client: redis.Redis, server: RedisServer) -> None:
    pytest.importorskip("starlette")
    from belayq.web.app import Dashboard

    ReliableQueue(client, "jobs", keeper=False).publish(b"x")
    board = Dashboard(client)
    assert board.overview()["eviction"] is None
    client.config_set("maxmemory-policy", "allkeys-random")
    text = board.overview()["eviction"]
    assert "allkeys-random" in text and docs_url() in text


def test_no_tool_warns_when_the_server_has_no_memory_limit(
        client: redis.Redis, server: RedisServer, capsys: Any) -> None:
    ReliableQueue(client, "jobs", keeper=False).publish(b"x")
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("maxmemory", "0")  # no limit: the server never evicts
    assert of(client) is None
    code, out, err = run(capsys, "stats", "--url", url(server), "jobs")
    assert code == 0 and "maxmemory-policy" not in out + err
    code, out, err = run(capsys, "queues", "--url", url(server))
    assert code == 0 and "jobs" in out and "maxmemory-policy" not in out + err
    assert gauge(client, []) == [({"policy": "noeviction", "evicts": "nothing"}, 0.0)]
    client.execute_command("ACL", "SETUSER", "noconfig", "on", f">{PASSWORD}", "~*", "&*",
                           "+@all", "-config")
    try:  # INFO memory, read where CONFIG is refused, tells the limit too
        limited = redis.Redis(port=server.port, username="noconfig", password=PASSWORD)
        assert of(limited) is None
        limited.close()
    finally:
        client.execute_command("ACL", "DELUSER", "noconfig")
    client.config_set("maxmemory", "1gb")  # a limit: now it may evict
    found = of(client)
    assert found is not None and found.policy == "allkeys-lru"
