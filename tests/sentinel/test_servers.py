"""The Sentinel fixture itself: a group starts settled, and a killed primary is replaced."""

from __future__ import annotations

from collections.abc import Callable

import redis
from redis.sentinel import Sentinel

from belayq.embedded import RedisSentinelServers
from tests.conftest import any_binary


def test_kill_primary_promotes_a_replica(sentinel_servers: RedisSentinelServers) -> None:
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
