"""A real Celery worker on ``belayq+cluster://`` (3 masters + 3 replicas) while the master
of its queue is killed: with ``wait_replicas=1`` nothing is lost, only tasks in flight at
the kill run twice, and the same worker process carries on. The time without service is
printed (``-s``)."""

from __future__ import annotations

import collections
import itertools
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq.embedded import RedisClusterServers
from belayq.keys import kombu_layout
from tests.clusterfail.conftest import failover_cluster  # noqa: F401  (the fixture)
from tests.support import wait_for

from .conftest import HERE, Worker
from .test_celery_worker import app
from .test_cluster import cluster_url


@pytest.fixture
def failover_env(
    failover_cluster: RedisClusterServers, redis_server: Any  # noqa: F811
) -> dict[str, str]:
    name = f"kf-{uuid.uuid4().hex[:8]}"
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        BQ_BROKER=cluster_url(failover_cluster),
        BQ_BACKEND=f"redis://127.0.0.1:{redis_server.port}/1",
        BQ_QUEUE=name,
        BQ_RECORDS=f"records:{name}",
        BQ_LEASE="5",
        BQ_WAIT_REPLICAS="1",
    )


@pytest.fixture
def failover_worker(failover_env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    w = Worker(failover_env, tmp_path / "worker.log", f"wf-{uuid.uuid4().hex[:6]}@%h",
               ["--pool=prefork", "-c", "2"])
    try:
        yield w.wait_ready()
    finally:
        w.stop()
        if os.environ.get("BQ_SHOW_LOGS"):
            print(w.text())


def longest_stall(rows: list[dict[str, Any]], killed: float) -> float:
    """The longest gap between task starts from the last start before ``killed`` on: the
    time without service."""
    starts = sorted(r["t"] for r in rows if r["ev"] == "start")
    before = [t for t in starts if t <= killed]
    times = ([before[-1]] if before else [killed]) + [t for t in starts if t > killed]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def has_replica(cluster: RedisClusterServers, master: Any) -> bool:
    try:
        cluster.replica_of(master)
    except RuntimeError:
        return False
    info = redis.Redis(port=master.port).info("replication")
    return any(isinstance(v, dict) and v.get("state") == "online" for v in info.values())


def test_a_killed_master_loses_nothing_and_the_worker_carries_on(
    failover_cluster: RedisClusterServers,  # noqa: F811
    failover_worker: Worker,
    failover_env: dict[str, str],
    redis_server: Any,
) -> None:
    env = failover_env
    records = redis.Redis(port=redis_server.port, db=1)

    def events(ev: str) -> collections.Counter[int]:
        rows = [json.loads(x) for x in records.lrange(env["BQ_RECORDS"], 0, -1)]
        return collections.Counter(r["i"] for r in rows if r["ev"] == ev)

    def rows() -> list[dict[str, Any]]:
        return [json.loads(x) for x in records.lrange(env["BQ_RECORDS"], 0, -1)]

    mod = app(env)
    before = 40
    for i in range(before):
        mod.sleeper.delay(i, 0.1)
    wait_for(lambda: len(events("done")) >= 10, 30, "ten tasks done before the kill")
    ready_key = str(kombu_layout(env["BQ_QUEUE"], cluster=True)["ready_key"])
    master = failover_cluster.master_of_key(ready_key)
    replica = failover_cluster.replica_of(master)
    in_flight = set(events("start")) - set(events("done"))
    failover_cluster.kill(master)
    killed = time.time()
    failover_cluster.wait_promoted(replica)
    promoted = time.time() - killed
    # wait_replicas=1: a publish now needs the new master to have a replica again. The
    # old master comes back as one (its nodes.conf is kept), as a restarted pod would.
    master.start()
    wait_for(lambda: has_replica(failover_cluster, replica), 30, "the old master to rejoin")
    after = 10
    for i in range(before, before + after):
        mod.sleeper.delay(i, 0.1)
    total = before + after
    wait_for(lambda: len(events("done")) == total, 40,
             lambda: f"every task done; missing {sorted(set(range(total)) - set(events('done')))}",
             step=0.2)
    stall = longest_stall([r for r in rows() if r["i"] < before], killed)
    starts = events("start")
    twice = {i for i, n in starts.items() if n > 1}
    print(f"\ncluster failover (wait_replicas=1, lease 5 s): replica promoted {promoted:.1f} s "
          f"after the kill; longest time without a task starting: {stall:.1f} s; {total} "
          f"tasks, 0 lost, {len(twice)} ran twice ({len(in_flight)} were in flight at the kill)")
    assert set(events("done")) == set(range(total))  # nothing lost
    assert twice <= in_flight, (twice, in_flight)  # duplicates: only what was in flight
    assert failover_worker.proc.poll() is None  # the same process, never restarted
    assert failover_worker.text().count(" ready.") == 1
    assert "ReadOnlyError" not in failover_worker.text()
    assert stall < 20, stall  # generous: a shared 2-core box
