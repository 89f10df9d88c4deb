"""belayq_dramatiq.Broker on a Redis Cluster, with Dramatiq's own Worker: one hash tag per
queue puts its list, its bodies and the core's keys on one slot."""

from __future__ import annotations

from redis.cluster import RedisCluster
from redis.crc import key_slot

from belayq_dramatiq import Broker
from belayq_dramatiq.store import Store
from tests.plugins.dramatiq.inproc import run_with_worker, sends_and_drains


def test_on_a_redis_cluster_each_queue_keeps_one_slot(cluster_client: RedisCluster) -> None:
    broker = Broker(client=cluster_client, lease_ms=2000)
    run_with_worker(broker, sends_and_drains(broker, 20))
    store = broker.store("default")
    assert isinstance(store, Store)
    assert store.core.keys.ready == "dramatiq:{default}"
    store.core.keys.check_one_slot()
    assert key_slot(store.core.keys.payloads.encode()) == key_slot(store.core.keys.ready.encode())
    stats = store.core.stats()
    assert stats["acked"] == 21 and stats["promoted"] == 1 and stats["in_flight"] == 0
