"""The Sentinel fixture itself: a group starts settled, and a killed primary is replaced (on
Redis and on Valkey 9.1, whose sentinels are ``valkey-server --sentinel``); a valkey-py
Sentinel client of a queue follows a failover."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from redis.sentinel import Sentinel

from belayq import ConnectionLost, DurabilityError, ReliableQueue
from belayq.embedded import RedisSentinelServers
from tests.conftest import ON_BOTH, any_binary
from tests.support import wait_for


@ON_BOTH
def test_kill_primary_promotes_a_replica(
    sentinel_servers: RedisSentinelServers, server_kind: str
) -> None:
    group = sentinel_servers
    old = group.master_address()
    assert old == ("127.0.0.1", group.servers[0].port)
    sentinel = Sentinel(group.sentinel_addresses, socket_timeout=2)
    assert len(sentinel.discover_slaves(group.service_name)) == 2
    master = sentinel.master_for(group.service_name, socket_timeout=2)
    master.set("before", "1")
    assert int(master.execute_command("WAIT", 2, 5000)) == 2

    assert group.kill_primary() == old
    new = group.wait_for_new_primary(old, replicas=1)
    assert new != old and new[1] in {s.port for s in group.servers[1:]}
    assert group.primary.port == new[1]
    # The Sentinel-managed client finds the new primary by itself, with the data.
    assert master.get("before") == b"1"
    with redis.Redis(port=new[1]) as direct:
        assert direct.info("replication")["role"] == "master"
        if server_kind == "valkey":
            assert direct.info("server")["server_name"] == "valkey"
            with redis.Redis(port=group.sentinels[0].port) as sentinel_node:
                info = sentinel_node.info("server")
                assert (info["server_name"], info["server_mode"]) == ("valkey", "sentinel")
    master.close()


@pytest.mark.servers("valkey")
def test_a_valkey_py_sentinel_client_follows_a_failover(
    sentinel_servers: RedisSentinelServers, server_kind: str, qname: str
) -> None:
    """``valkey.sentinel.Sentinel(...).master_for(name)`` under a queue with its lease keeper:
    the keeper's primary watcher asks the sentinels with valkey-py's own classes, and after
    the primary is killed the same queue object works on the promoted replica."""
    from valkey.sentinel import Sentinel as ValkeySentinel

    group = sentinel_servers
    master = ValkeySentinel(group.sentinel_addresses, socket_timeout=1).master_for(
        group.service_name, socket_timeout=2
    )
    q = ReliableQueue(master, qname, lease_ms=3000, wait_replicas=1, wait_timeout_ms=2000)
    before = q.publish(b"before")
    [held] = q.claim(timeout=1)
    assert held.id == before
    old = group.kill_primary()
    group.wait_for_new_primary(old, replicas=1)

    def publishes() -> str | None:
        try:
            return q.publish(b"after")
        except (ConnectionLost, DurabilityError):  # a DurabilityError's publish is stored
            return None

    after = wait_for(publishes, 30, "a publish on the promoted replica")
    assert q.ack(held) is True, "the claim made before the failover is still held"
    got = q.claim(timeout=1, count=100)
    assert after in {d.id for d in got} and {d.payload for d in got} == {b"after"}
    assert q.ack_many(got) == [True] * len(got)
    assert q.stats()["ready"] == 0 and q.stats()["in_flight"] == 0
    q.close()
    master.close()


def test_redis_server_in_sentinel_mode_stands_in_for_redis_sentinel(
    start_sentinels: Callable[..., RedisSentinelServers],
) -> None:
    """Without a ``redis-sentinel`` program, ``redis-server --sentinel`` is used."""
    group = start_sentinels(sentinel_command=[any_binary(), "--sentinel"])
    assert group.master_address() == ("127.0.0.1", group.servers[0].port)
    for sentinel in group.sentinels:
        with redis.Redis(port=sentinel.port) as client:
            assert client.info("server")["redis_mode"] == "sentinel"
