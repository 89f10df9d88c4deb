"""belayq_dramatiq.Broker on a Redis Cluster, with Dramatiq's own Worker: one hash tag per
queue puts its list, its bodies and the core's keys on one slot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from belayq.embedded import RedisClusterServers
from belayq.keeper import KEEPER
from belayq_dramatiq import Broker
from tests.plugins.dramatiq.inproc import Ran, run_with_worker
from tests.support import wait_for


@pytest.fixture
def cluster_client(cluster_servers: RedisClusterServers) -> Iterator[RedisCluster]:
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in
                                         cluster_servers.startup_nodes])
    client.flushall()
    try:
        yield client
    finally:
        KEEPER.stop_all()
        client.close()


def test_on_a_redis_cluster_each_queue_keeps_one_slot(cluster_client: RedisCluster) -> None:
    broker = Broker(client=cluster_client, lease_ms=2000)

    def body(ran: Ran) -> None:
        for i in range(20):
            ran.actor.send(f"k{i}")
        ran.actor.send_with_options(args=("late",), delay=300)
        expected = {*(f"k{i}" for i in range(20)), "late"}
        wait_for(lambda: ran.seen() == expected, 30, ran.seen)
        broker.join("default", timeout=10_000)

    run_with_worker(broker, body)
    store = broker.store("default")
    assert store.core.keys.ready == "dramatiq:{default}"
    store.core.keys.check_one_slot()
    assert key_slot(store.messages.encode()) == key_slot(store.core.keys.ready.encode())
    stats = store.core.stats()
    assert stats["acked"] == 21 and stats["promoted"] == 1 and stats["in_flight"] == 0
