"""The broker URL forms (``belayq://``, ``belayq+cluster://``, ``belayq+sentinel://`` and
their TLS forms) and the one clear error each bad URL gets. None of them falls back to
``localhost:6379``."""

from __future__ import annotations

from typing import Any

import kombu
import pytest
from kombu.exceptions import OperationalError

import belayq_kombu
from belayq_kombu import topology


def place(url: str, **kw: Any) -> topology.Topology:
    return topology.of_connection(kombu.Connection(url, **kw))


def test_the_forms() -> None:
    assert place("belayq://h:6379/0").kind == topology.SINGLE
    cluster = place("belayq+cluster://:pw@h1:7000;belayq+cluster://h2")
    assert (cluster.kind, cluster.nodes, cluster.password, cluster.tls) == (
        "cluster", (("h1", 7000), ("h2", 6379)), "pw", False)
    sentinel = place("belayq+sentinel://u:p%40ss@s1:26380/3;belayq+sentinel://s2")
    assert (sentinel.kind, sentinel.nodes, sentinel.username, sentinel.password,
            sentinel.db) == ("sentinel", (("s1", 26380), ("s2", 26379)), "u", "p@ss", 3)
    assert place("belayq+clusters://h1:7000").tls
    assert place("belayq+sentinels://h1").tls
    assert set(belayq_kombu.ALIASES) <= set(kombu.transport.TRANSPORT_ALIASES)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("belayq+redis://h:6379", r"belayq\+redis:// is not a belayq URL form"),
        ("belayq+cluster://h1:7000;belayq+sentinel://h2", "must use one form for all"),
        ("belayq+cluster://h1:7000/2", "a Redis Cluster has database 0 only"),
        ("belayq+sentinel://s1/x", "the database must be a number"),
        ("belayq+cluster://h1:notaport", "has a bad port"),
    ],
)
def test_bad_urls_give_one_clear_error(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kombu.Connection(url).connect()


def test_sentinel_options_need_a_sentinel_url() -> None:
    with pytest.raises(ValueError, match="'sentinel_kwargs' is for Redis Sentinel"):
        kombu.Connection("belayq+cluster://h1:7000",
                         transport_options={"sentinel_kwargs": {}}).connect()


def test_a_cluster_url_with_no_node_reachable() -> None:
    conn = kombu.Connection("belayq+cluster://127.0.0.1:1;belayq+cluster://127.0.0.1:2")
    with pytest.raises(OperationalError, match=r"no node of the Redis Cluster at 127\.0\.0\.1:1"):
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    conn.release()


def test_a_cluster_url_for_a_server_not_in_cluster_mode(redis_server: Any) -> None:
    url = f"belayq+cluster://127.0.0.1:{redis_server.port}"
    with pytest.raises(ValueError, match="not in cluster mode"):
        kombu.Connection(url).connect()


def test_a_single_server_url_for_a_cluster_node(cluster_servers: Any) -> None:
    host, port = cluster_servers.startup_nodes[0]
    with pytest.raises(ValueError, match="is a Redis Cluster node: use a belayq"):
        kombu.Connection(f"belayq://{host}:{port}/0").connect()


def test_global_keyprefix_is_refused_on_a_cluster(cluster_servers: Any) -> None:
    host, port = cluster_servers.startup_nodes[0]
    conn = kombu.Connection(f"belayq+cluster://{host}:{port}",
                            transport_options={"global_keyprefix": "app:"})
    with pytest.raises(ValueError, match="does not support the transport option 'global_key"):
        conn.connect()
    conn.release()
