"""The Sentinel fixture itself: a group starts settled, and a killed primary is replaced."""

from __future__ import annotations

import redis
from redis.sentinel import Sentinel

from belayq.embedded import RedisSentinelServers


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
