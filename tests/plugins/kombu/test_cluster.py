"""``belayq+cluster://``: kombu and a real Celery worker on a 3-master Redis Cluster, with
queues whose hash tags land on different nodes; results in a separate single-node Redis
(Celery's redis result backend is single-node)."""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
from redis.cluster import ClusterNode, RedisCluster

from belayq import ReliableQueue
from belayq.embedded import RedisClusterServers
from belayq.keys import kombu_layout
from tests.support import wait_for

from .conftest import CELERY, HERE, Worker
from .test_transport import drain


def cluster_url(cluster: RedisClusterServers) -> str:
    return ";".join(f"belayq+cluster://{h}:{p}" for h, p in cluster.startup_nodes)


def cluster_client(cluster: RedisClusterServers) -> RedisCluster:
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])


def names_on_distinct_nodes(client: RedisCluster, count: int = 3) -> list[str]:
    """``count`` fresh kombu queue names whose lists live on ``count`` different masters."""
    found: dict[str, str] = {}
    while len(found) < count:
        name = f"kc-{uuid.uuid4().hex[:8]}"
        node = client.get_node_from_key(kombu_layout(name, cluster=True)["ready_key"])
        found.setdefault(node.name, name)
    return list(found.values())


def core_stats(client: RedisCluster, name: str) -> dict[str, int]:
    rq = ReliableQueue(client, name, keeper=False, **kombu_layout(name, cluster=True))  # type: ignore[arg-type]
    return dict(rq.stats())


@pytest.fixture
def cclient(cluster_servers: RedisClusterServers) -> Iterator[RedisCluster]:
    client = cluster_client(cluster_servers)
    yield client
    client.close()


def test_queues_on_every_node_publish_consume_count_purge(
    cluster_servers: RedisClusterServers, cclient: RedisCluster
) -> None:
    names = names_on_distinct_nodes(cclient)
    url = cluster_url(cluster_servers)
    queues = [kombu.Queue(n, routing_key=n) for n in names]
    with kombu.Connection(url) as conn:
        producer = conn.Producer()
        for q in queues:
            for i in range(4):  # every priority level of the queue
                producer.publish({"q": q.name, "i": i}, exchange=q.exchange,
                                 routing_key=q.routing_key, declare=[q], priority=3 * i)
        channel = conn.default_channel
        assert [channel._size(n) for n in names] == [4, 4, 4]  # the stock _size: CROSSSLOT
        got = drain(conn, queues, 12, prefetch_count=5)
        assert collections.Counter(m.payload["q"] for m in got) == {n: 4 for n in names}
        for q in queues:
            producer.publish({"late": 1}, exchange=q.exchange, routing_key=q.routing_key)
        assert channel._purge(names[0]) == 1
        channel._delete(names[1], "", names[1], "")
        assert not channel._has_queue(names[1])
        assert channel._has_queue(names[2])
    stats = [core_stats(cclient, n) for n in (names[0], names[2])]
    assert [(s["acked"], s["in_flight"], s["ready"]) for s in stats] == [(4, 0, 0), (4, 0, 1)]
    assert cclient.exists(f"{{{names[1]}}}:stats") == 0  # deleted with all its keys
    # Every key of a queue shares its slot: the lists are inside the hash tag.
    assert cclient.exists(f"{{{names[2]}}}") == 1


def test_fanout_and_an_expiring_reply_queue(cluster_servers: RedisClusterServers) -> None:
    # Celery's remote control: a fanout exchange (pub/sub: a PUBLISH on one node reaches
    # the subscribers on the others) and auto-delete reply queues with x-expires (kombu
    # >= 5.4 keeps their bindings with a two-slot script: left out on a cluster).
    url = cluster_url(cluster_servers)
    tag = uuid.uuid4().hex[:8]
    fan = kombu.Exchange(f"fx-{tag}", type="fanout")
    listeners = [kombu.Queue(f"fl{i}-{tag}", fan, auto_delete=True) for i in range(2)]
    reply = kombu.Queue(f"{tag}.reply", kombu.Exchange(f"rx-{tag}"), routing_key=tag,
                        auto_delete=True, expires=10)
    conns = [kombu.Connection(url) for _ in listeners]
    try:
        got: list[list[Any]] = [[] for _ in listeners]
        consumers = []
        for conn, q, box in zip(conns, listeners, got, strict=True):
            c = kombu.Consumer(conn, [q], callbacks=[lambda b, m, box=box: box.append(b)],
                               no_ack=True)
            c.consume()
            consumers.append(c)
            with_timeout(conn)  # subscribe now
        with kombu.Connection(url) as producer_conn:
            producer_conn.Producer().publish({"ping": 1}, exchange=fan, declare=[fan])
            producer_conn.Producer().publish({"pong": 1}, exchange=reply.exchange,
                                             routing_key=tag, declare=[reply])
            for conn, box in zip(conns, got, strict=True):
                wait_for(lambda conn=conn, box=box: with_timeout(conn) or box, 10,
                         "the fanout message")
            assert got == [[{"ping": 1}], [{"ping": 1}]]
            replies = drain(producer_conn, [reply], 1)
            assert [m.payload for m in replies] == [{"pong": 1}]
        for c in consumers:
            c.cancel()
    finally:
        for conn in conns:
            conn.release()


def with_timeout(conn: kombu.Connection) -> bool:
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.2)
    return False


# -- a real Celery worker ----------------------------------------------------------------


@pytest.fixture
def cluster_worker_env(
    cluster_servers: RedisClusterServers, cclient: RedisCluster, redis_server: Any,
) -> dict[str, str]:
    names = names_on_distinct_nodes(cclient)
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        BQ_BROKER=cluster_url(cluster_servers),
        BQ_BACKEND=f"redis://127.0.0.1:{redis_server.port}/1",
        BQ_QUEUE=names[0],
        BQ_QUEUES=",".join(names),
        BQ_RECORDS=f"records:{names[0]}",
    )


@pytest.fixture
def cluster_worker(cluster_worker_env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    name = f"wc-{uuid.uuid4().hex[:6]}@%h"
    w = Worker(cluster_worker_env, tmp_path / "worker.log", name,
               ["--pool=prefork", "-c", "2", "-Q", cluster_worker_env["BQ_QUEUES"]])
    try:
        yield w.wait_ready()
    finally:
        w.stop()
        if os.environ.get("BQ_SHOW_LOGS"):
            print(w.text())


def test_a_celery_worker_on_a_cluster(
    cluster_worker: Worker, cluster_worker_env: dict[str, str], cclient: RedisCluster
) -> None:
    from .test_celery_worker import app

    env = cluster_worker_env
    mod = app(env)
    names = env["BQ_QUEUES"].split(",")
    results = [mod.add.apply_async((i, i), queue=names[i % 3]) for i in range(12)]
    try:
        assert [r.get(timeout=30) for r in results] == [2 * i for i in range(12)]
        results[:] = [
            mod.flaky.apply_async((7, 1.0), queue=names[1]),  # a retry with a countdown
            mod.add.apply_async((20, 1), queue=names[2], countdown=1.5),  # an ETA
        ]
        assert [r.get(timeout=30) for r in results] == [7, 21]
    finally:
        let_results_go(results)
    node = cluster_worker.name.replace("%h", socket.gethostname())
    assert "pong" in control(env, "inspect", "ping", "-d", node, "-t", "10")
    active = control(env, "inspect", "active_queues", "-d", node, "-t", "10")
    assert all(n in active for n in names), active
    assert "belayq+cluster://" in cluster_worker.text()
    stats = [core_stats(cclient, n) for n in names]
    assert all(s["in_flight"] == 0 and s["ready"] == 0 for s in stats), stats
    assert sum(s["acked"] for s in stats) >= 14, stats


def let_results_go(results: list[Any]) -> None:
    """Drop the results while their store runs: a result collected after it stopped retries
    unsubscribing for two minutes (Celery's redis backend, at garbage collection)."""
    del results[:]
    gc.collect()


def control(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([*CELERY, "-A", "worker_app", *args], env=env, cwd=HERE,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
