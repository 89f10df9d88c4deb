"""A primary demoted under a worker (celery#7946: an ElastiCache failover left workers on a
node that answers READONLY, and Celery treated the error as fatal). On ``belayq://`` a
READONLY reply closes the connection and is a connection error: Celery reconnects, with
its usual backoff, until the address serves a primary again, and the same worker process
runs every task."""

from __future__ import annotations

import collections
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq.embedded import RedisServer
from belayq_kombu.topology import FailoverConnection
from tests.conftest import any_binary
from tests.support import wait_for

from .conftest import HERE, Worker
from .test_celery_worker import app


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    """Two servers of this test: ``a`` the primary, ``b`` its replica (in sync)."""
    a = RedisServer(any_binary(), args=["--repl-diskless-sync-delay", "0"])
    b = RedisServer(any_binary(), args=["--repl-diskless-sync-delay", "0"])
    try:
        a.start()
        b.start()
        redis.Redis(port=b.port).replicaof("127.0.0.1", a.port)
        wait_for(lambda: in_sync(a), 20, "the replica to sync")
        yield a, b
    finally:
        b.stop()
        a.stop()


def in_sync(primary: RedisServer) -> bool:
    info = redis.Redis(port=primary.port).info("replication")
    return any(isinstance(v, dict) and v.get("state") == "online" for v in info.values())


def swap(new_primary: RedisServer, new_replica: RedisServer) -> None:
    redis.Redis(port=new_primary.port).replicaof("NO", "ONE")
    redis.Redis(port=new_replica.port).replicaof("127.0.0.1", new_primary.port)


def test_a_readonly_reply_is_a_connection_error(pair: tuple[RedisServer, RedisServer]) -> None:
    _, b = pair
    pool = redis.ConnectionPool(port=b.port, connection_class=FailoverConnection)
    client = redis.Redis(connection_pool=pool)
    with pytest.raises(redis.ConnectionError, match="a failover demoted it"):
        client.set("k", "v")
    pool.disconnect()


@pytest.fixture
def demoted_env(pair: tuple[RedisServer, RedisServer], redis_server: Any) -> dict[str, str]:
    name = f"kd-{uuid.uuid4().hex[:8]}"
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        BQ_BROKER=f"belayq://127.0.0.1:{pair[0].port}/0",
        BQ_BACKEND=f"redis://127.0.0.1:{redis_server.port}/1",
        BQ_QUEUE=name,
        BQ_RECORDS=f"records:{name}",
        BQ_LEASE="5",
    )


@pytest.fixture
def demoted_worker(demoted_env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    w = Worker(demoted_env, tmp_path / "worker.log", f"wd-{uuid.uuid4().hex[:6]}@%h",
               ["--pool=prefork", "-c", "2"])
    try:
        yield w.wait_ready()
    finally:
        w.stop()
        if os.environ.get("BQ_SHOW_LOGS"):
            print(w.text())


def test_a_worker_whose_primary_is_demoted_reconnects_and_carries_on(
    pair: tuple[RedisServer, RedisServer], demoted_worker: Worker,
    demoted_env: dict[str, str], redis_server: Any,
) -> None:
    a, b = pair
    env = demoted_env
    records = redis.Redis(port=redis_server.port, db=1)

    def done() -> collections.Counter[int]:
        rows = [json.loads(x) for x in records.lrange(env["BQ_RECORDS"], 0, -1)]
        return collections.Counter(r["i"] for r in rows if r["ev"] == "done")

    mod = app(env)
    for i in range(30):
        mod.sleeper.delay(i, 0.1)
    wait_for(lambda: len(done()) >= 5, 30, "five tasks done")
    swap(b, a)  # the worker's address now answers READONLY
    wait_for(lambda: "a failover demoted it" in demoted_worker.text(), 20,
             "the worker to meet the READONLY reply")
    demoted_at = time.time()
    wait_for(lambda: in_sync(b), 20, "the demoted node to sync")
    wait_for(lambda: "serves a replica now" in demoted_worker.text(), 20,
             "a reconnect to be refused")
    swap(a, b)  # the address serves the primary again (what a DNS failover ends with)
    wait_for(lambda: set(done()) == set(range(30)), 40,
             lambda: f"every task; missing {sorted(set(range(30)) - set(done()))}", step=0.2)
    print(f"\ndemoted primary: the worker reconnected and finished every task "
          f"{time.time() - demoted_at:.1f} s after its first READONLY reply")
    assert demoted_worker.proc.poll() is None
    assert demoted_worker.text().count(" ready.") == 1
    assert "Unrecoverable error" not in demoted_worker.text()
    assert "Connection to broker lost" in demoted_worker.text()
    # Reconnects to the replica are refused with a clear reason and Celery's backoff,
    # not accepted and dropped at the first write, over and over.
    assert "serves a replica now (a failover demoted it?)" in demoted_worker.text()
    assert "Frequent restarts detected" not in demoted_worker.text()
