"""``belayq+sentinel://``: a real Celery worker on the primary three sentinels name, through
a failover (the primary is killed, a replica promoted): with ``wait_replicas=1`` nothing
is lost, only tasks in flight at the kill may run twice, and the same worker process
carries on (no ReadOnlyError, no restart). Without it, what was lost is counted. Figures
are printed (``-s``)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis

from belayq.embedded import RedisSentinelServers
from tests.sentinel.conftest import data_binary, sentinel_command, start_sentinels  # noqa: F401
from tests.support import wait_for

from .conftest import HERE, Worker
from .test_celery_worker import app
from .test_cluster import pong
from .test_cluster_failover import longest_stall


def sentinel_url(group: RedisSentinelServers) -> str:
    return ";".join(f"belayq+sentinel://{h}:{p}/0" for h, p in group.sentinel_addresses)


def test_a_sentinel_url_without_master_name_is_refused() -> None:
    url = "belayq+sentinel://127.0.0.1:1;belayq+sentinel://127.0.0.1:2"
    with pytest.raises(ValueError, match="needs the transport option 'master_name'"):
        kombu.Connection(url).connect()


def test_unreachable_sentinels_are_a_connection_error_kombu_retries() -> None:
    from kombu.exceptions import OperationalError
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    url = "belayq+sentinel://127.0.0.1:1;belayq+sentinel://127.0.0.1:2"
    no_retry = {"retry": Retry(NoBackoff(), 0)}  # else redis-py backs off ~7 s per sentinel
    conn = kombu.Connection(url, transport_options={"master_name": "m",
                                                    "sentinel_kwargs": no_retry})
    with pytest.raises(OperationalError, match="No master found for 'm'"):
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    conn.release()


@pytest.fixture
def group(start_sentinels: Callable[..., RedisSentinelServers]) -> RedisSentinelServers:  # noqa: F811
    return start_sentinels()


def test_flower_counts_the_queues_on_the_named_primary(group: RedisSentinelServers) -> None:
    pytest.importorskip("flower")
    import asyncio

    from flower.utils.broker import Broker

    import belayq_kombu.flower  # noqa: F401  (teaches Flower the belayq schemes)

    name = f"ks-{uuid.uuid4().hex[:8]}"
    options = {"master_name": group.service_name}
    with kombu.Connection(sentinel_url(group), transport_options=options) as conn:
        sq = conn.SimpleQueue(name)
        for i in range(3):
            sq.put({"i": i}, priority=3 * i)
        sq.close()
    host, port = group.sentinel_addresses[0]
    broker = Broker(f"belayq+sentinel://{host}:{port}/0", broker_options=options)
    assert asyncio.run(broker.queues([name])) == [{"name": name, "messages": 3}]


@pytest.fixture
def sentinel_env(group: RedisSentinelServers, redis_server: Any) -> dict[str, str]:
    name = f"ks-{uuid.uuid4().hex[:8]}"
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        BQ_BROKER=sentinel_url(group),
        BQ_MASTER_NAME=group.service_name,
        BQ_BACKEND=f"redis://127.0.0.1:{redis_server.port}/1",
        BQ_QUEUE=name,
        BQ_RECORDS=f"records:{name}",
        BQ_LEASE="5",
    )


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Worker]]:
    started: list[Worker] = []

    def start(env: dict[str, str]) -> Worker:
        w = Worker(env, tmp_path / f"worker{len(started)}.log", f"ws-{uuid.uuid4().hex[:6]}@%h",
                   ["--pool=prefork", "-c", "2"])
        started.append(w)
        return w.wait_ready()

    yield start
    for w in started:
        w.stop()
        if os.environ.get("BQ_SHOW_LOGS"):
            print(w.text())


@pytest.mark.parametrize("wait_replicas", [1, 0])
def test_a_celery_worker_through_a_sentinel_failover(
    wait_replicas: int, group: RedisSentinelServers, sentinel_env: dict[str, str],
    start_worker: Callable[[dict[str, str]], Worker], redis_server: Any,
) -> None:
    env = {**sentinel_env, "BQ_WAIT_REPLICAS": str(wait_replicas)}
    worker = start_worker(env)
    records = redis.Redis(port=redis_server.port, db=1)

    def rows() -> list[dict[str, Any]]:
        return [json.loads(x) for x in records.lrange(env["BQ_RECORDS"], 0, -1)]

    def events(ev: str) -> collections.Counter[int]:
        return collections.Counter(r["i"] for r in rows() if r["ev"] == ev)

    mod = app(env)
    before, after = 40, 10
    for i in range(before):
        mod.sleeper.delay(i, 0.1)
    wait_for(lambda: len(events("done")) >= 10, 30, "ten tasks done before the kill")
    in_flight = set(events("start")) - set(events("done"))
    old = group.kill_primary()
    killed = time.time()
    group.wait_for_new_primary(old, replicas=1)
    promoted = time.time() - killed
    for i in range(before, before + after):
        mod.sleeper.delay(i, 0.1)
    total = set(range(before + after))
    wait_for(lambda: set(events("done")) >= total - set(range(before)), 40,
             "the tasks sent after the failover", step=0.2)
    if wait_replicas:
        wait_for(lambda: set(events("done")) == total, 20,
                 lambda: f"every task; missing {sorted(total - set(events('done')))}", step=0.2)
    else:  # what async replication lost never comes: wait a lease and more, then count
        with contextlib.suppress(AssertionError):
            wait_for(lambda: set(events("done")) == total, 8, "every task", step=0.2)
    lost = total - set(events("done"))
    twice = {i for i, n in events("start").items() if n > 1}
    stall = longest_stall([r for r in rows() if r["i"] < before], killed)
    print(f"\nsentinel failover (wait_replicas={wait_replicas}, lease 5 s): new primary "
          f"{promoted:.1f} s after the kill; longest time without a task starting: "
          f"{stall:.1f} s; {len(total)} tasks, {len(lost)} lost, {len(twice)} ran twice "
          f"({len(in_flight)} were in flight at the kill)")
    node = worker.name.replace("%h", socket.gethostname())
    assert pong(env, node)  # remote control (pidbox) after the failover
    assert worker.proc.poll() is None  # the same process, never restarted
    assert worker.text().count(" ready.") == 1
    assert "ReadOnlyError" not in worker.text()
    assert "Unrecoverable error" not in worker.text()
    if wait_replicas:
        assert not lost
        assert twice <= in_flight, (twice, in_flight)
        assert stall < 20, stall  # generous: a shared 2-core box
