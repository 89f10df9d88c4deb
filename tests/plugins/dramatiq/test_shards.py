"""belayq_dramatiq.Broker with ``shards``: each queue in belayq's own keys over several hash
slots, the bodies in the core's payloads. Dramatiq's Worker drains it (delayed and retried
messages included) without creating stock's keys; the registry, the tools and the dashboard
open it as recorded; a queue laid out otherwise is refused before anything is written, a
core queue of the same name stays apart (dropping one leaves the other), a dropped queue can
be laid out anew, stock producers' messages move in; on a Redis Cluster the shards spread
over the nodes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from redis.cluster import RedisCluster
from redis.crc import key_slot

from belayq import ConfigError, ReliableQueue, ShardedQueue
from belayq.discovery import find, list_queues, open_found
from belayq.kinds import tools_for
from belayq.registry import Registry
from belayq.web.console import message as message_detail
from belayq_dramatiq import Broker
from tests.plugins.dramatiq.inproc import Ran, run_with_worker, sends_and_drains
from tests.support import wait_for


def _send(broker: Broker, key: str) -> None:
    broker.enqueue(dramatiq.Message(queue_name="default", actor_name="mark", args=(key,),
                                    kwargs={}, options={}))


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "belayq", args[0], "--url", url, *args[1:]],
                          capture_output=True, text=True, check=False, timeout=60)


@pytest.fixture
def broker(url: str, conn: redis.Redis) -> Iterator[Broker]:
    b = Broker(url=url, lease_ms=2000, shards=3)
    try:
        yield b
    finally:
        b.close()


def send(broker: Broker, key: str, delay: int | None = None,
         actor: str = "mark") -> dramatiq.Message[Any]:
    return broker.enqueue(dramatiq.Message(queue_name="default", actor_name=actor,
                                           args=(key,), kwargs={}, options={}), delay=delay)


def test_a_worker_drains_a_sharded_queue_without_stock_keys(
    broker: Broker, conn: redis.Redis
) -> None:
    run_with_worker(broker, sends_and_drains(broker, 60))
    core = broker.store("default").core
    assert isinstance(core, ShardedQueue) and core.kind == "dramatiq"
    per_shard = [s["acked"] for s in core.shard_stats().values()]
    assert len(per_shard) == 3 and sum(per_shard) == 61 and min(per_shard) > 0
    assert core.stats()["promoted"] == 1 and core.stats()["in_flight"] == 0
    names = {k.decode() for k in conn.keys("*")}
    assert not {n for n in names if n.startswith("dramatiq:")}  # no stock list, no .msgs
    assert all(p.keys.ready.startswith("belayq:dramatiq:{default~s") for p in core.shards)
    [record] = [r for r in Registry(conn).all() if r.name == "default"]
    assert (record.kind, record.shards, record.ready_key) == ("dramatiq", 3, None)


def test_retries_and_dead_letters_keep_their_reasons_on_shards(broker: Broker) -> None:
    runs: list[str] = []

    def body(ran: Ran) -> None:
        @dramatiq.actor(broker=broker, max_retries=2, min_backoff=10, max_backoff=20)
        def fails(key: str) -> None:
            runs.append(key)
            raise RuntimeError(f"no {key}")

        for i in range(4):
            fails.send(f"f{i}")
        dead = broker.store("default").core.dead_letters
        wait_for(lambda: len(dead()) == 4, 30, dead)

    run_with_worker(broker, body)
    core = broker.store("default").core
    dead = core.dead_letters()
    assert sorted(d.reason for d in dead) == [f"RuntimeError: no f{i}" for i in range(4)]
    assert {dramatiq.Message.decode(d.payload).args[0] for d in dead if d.payload} == {
        f"f{i}" for i in range(4)}
    assert sorted(runs) == sorted(f"f{i}" for i in range(4) for _ in range(3))  # 1 + 2 retries
    assert core.stats()["delayed"] == 0 and core.stats()["in_flight"] == 0


def test_the_tools_open_show_and_purge_a_sharded_dramatiq_queue(
    broker: Broker, conn: redis.Redis
) -> None:
    broker.declare_queue("default")
    for key in ("a", "b", "c", "d"):
        send(broker, key)
    send(broker, "later", delay=60_000)
    assert [(f.kind, f.name) for f in list_queues(conn)] == [("dramatiq", "default")]
    q = open_found(conn, find(conn, "default"))
    assert isinstance(q, ShardedQueue) and q.kind == "dramatiq"
    assert q.stats()["ready"] == 4 and q.stats()["delayed"] == 1
    shard = next(p for p in q.shards if conn.llen(p.keys.ready))
    [message_id, *_] = [e.decode() for e in conn.lrange(shard.keys.ready, 0, 0)]
    detail = message_detail(q, message_id)
    assert detail["state"] == "ready" and detail["shard"] == shard.name
    assert detail["framework"]["actor_name"] == "mark"
    assert detail["framework"]["args"] in (["a"], ["b"], ["c"], ["d"])
    tools = tools_for("dramatiq")
    assert tools is not None
    purged = q.purge(delayed=False)
    assert (purged.ready, purged.delayed) == (4, 0)
    assert q.stats()["ready"] == 0 and q.stats()["delayed"] == 1


def test_a_queue_laid_out_otherwise_is_refused(url: str, conn: redis.Redis) -> None:
    stock = Broker(url=url)
    stock.declare_queue("default")
    send(stock, "waiting")
    with pytest.raises(ConfigError, match="laid out otherwise"):
        Broker(url=url, shards=3).declare_queue("default")
    assert conn.llen("dramatiq:default") == 1  # the waiting message stays where it was
    stock.close()
    three = Broker(url=url, shards=3)
    three.declare_queue("emails")
    with pytest.raises(ConfigError, match="sharded over 3 shards"):
        Broker(url=url, shards=2).declare_queue("emails")
    with pytest.raises(ConfigError, match="laid out otherwise"):
        Broker(url=url).declare_queue("emails")
    three.close()


def test_a_core_queue_of_the_same_name_stays_apart(broker: Broker, conn: redis.Redis) -> None:
    core = ShardedQueue(conn, "default", shards=3, keeper=False)
    core.publish(b"core message")
    plain = ReliableQueue(conn, "solo", keeper=False)
    plain.publish(b"core solo")
    broker.declare_queue("default")
    broker.declare_queue("solo")
    send(broker, "dramatiq message")
    assert core.stats()["ready"] == 1 and plain.stats()["ready"] == 1
    assert broker.store("default").core.stats()["ready"] == 1
    assert broker.store("solo").core.stats()["ready"] == 0
    kinds = sorted((f.kind, f.name) for f in list_queues(conn))
    assert kinds == [("belayq", "default"), ("belayq", "solo"), ("dramatiq", "default"),
                     ("dramatiq", "solo")]


def test_dropping_a_sharded_dramatiq_queue_leaves_a_same_named_core_queue_alone(
    url: str, conn: redis.Redis
) -> None:
    core = ShardedQueue(conn, "default", shards=3, keeper=False)
    core.publish(b"core 1")
    core.publish(b"core 2")
    core.close()
    b = Broker(url=url, shards=3)
    b.declare_queue("default")
    b.close()
    assert _cli(url, "drop", "default", "--kind", "dramatiq", "--yes").returncode == 0
    kinds = {(r.kind, r.name) for r in Registry(conn).all()}
    assert ("belayq", "default") in kinds  # the core queue's record stays
    assert conn.hget("belayq:{default}:stats", "shards") == b"3"  # and its shard count
    with pytest.raises(ConfigError, match="sharded over 3"):
        ShardedQueue(conn, "default", shards=2, keeper=False)  # its 2 messages would strand


def test_a_dropped_sharded_dramatiq_queue_can_be_laid_out_anew(
    url: str, conn: redis.Redis
) -> None:
    b = Broker(url=url, shards=3)
    b.declare_queue("default")
    _send(b, "x")
    b.flush("default")
    b.close()
    assert _cli(url, "drop", "default", "--kind", "dramatiq", "--yes").returncode == 0
    assert ("dramatiq", "default") not in {(r.kind, r.name) for r in Registry(conn).all()}
    assert not conn.exists("belayq:dramatiq:{default}:stats")
    again = Broker(url=url, shards=2)  # as the refusal advises: drop it, then the new count
    again.declare_queue("default")
    again.close()


def test_a_refused_switch_from_stock_keys_writes_no_shard_count(
    url: str, conn: redis.Redis
) -> None:
    stock = Broker(url=url)
    stock.declare_queue("default")
    _send(stock, "waiting")
    with pytest.raises(ConfigError, match="laid out otherwise"):
        Broker(url=url, shards=3).declare_queue("default")
    assert not conn.exists("belayq:dramatiq:{default}:stats")  # the refusal changed nothing
    stock.flush("default")
    stock.close()
    assert _cli(url, "drop", "default", "--kind", "dramatiq", "--yes").returncode == 0
    two = Broker(url=url, shards=2)  # a count that the refused broker never used
    two.declare_queue("default")
    two.close()


def test_stock_producers_messages_move_into_the_sharded_queue_and_run(
    url: str, conn: redis.Redis
) -> None:
    """A rolling migration into belayq's own keys: messages stock RedisBroker producers sent
    before the switch, and send during it (ready and delayed), run on a sharded broker's
    worker, once each; stock's lists end empty."""
    stock = RedisBroker(url=url)
    stock.enqueue(dramatiq.Message(queue_name="default", actor_name="note",
                                   args=("before",), kwargs={}, options={}))
    broker = Broker(url=url, lease_ms=2000, shards=3)

    def body(ran: Ran) -> None:
        for key in ("during-1", "during-2"):
            stock.enqueue(dramatiq.Message(queue_name="default", actor_name="note",
                                           args=(key,), kwargs={}, options={}))
        stock.enqueue(dramatiq.Message(queue_name="default", actor_name="note",
                                       args=("later",), kwargs={}, options={}), delay=300)
        expected = {"before", "during-1", "during-2", "later"}
        wait_for(lambda: ran.seen() == expected, 30, ran.seen)
        assert sorted(ran.keys) == sorted(expected)

    run_with_worker(broker, body)
    assert conn.llen("dramatiq:default") == 0 and conn.llen("dramatiq:default.DQ") == 0
    assert conn.hlen("dramatiq:default.msgs") == 0
    stock.close()
    assert [(r.kind, r.name, r.shards) for r in Registry(conn).all()
            if r.name == "default"] == [("dramatiq", "default", 3)]


def test_bad_shard_settings_are_refused_before_anything_is_written() -> None:
    for kwargs, named in (({"shards": 0}, "shards must be an int"),
                          ({"shards": "3"}, "shards must be an int"),
                          ({"shards": 3, "stock_delays": True}, "stock_delays"),
                          ({"shards": 3, "namespace": "app"}, "namespace")):
        with pytest.raises(ConfigError, match=named):
            Broker(url="redis://127.0.0.1:1/0", **kwargs)


def test_on_a_redis_cluster_the_shards_spread_over_the_nodes(
    cluster_client: RedisCluster
) -> None:
    broker = Broker(client=cluster_client, lease_ms=2000, shards=3)

    run_with_worker(broker, sends_and_drains(broker, 30))
    core = broker.store("default").core
    assert isinstance(core, ShardedQueue)
    nodes = {cluster_client.get_node_from_key(p.keys.ready).name for p in core.shards}
    assert len(nodes) == 3
    assert len({key_slot(p.keys.ready.encode()) for p in core.shards}) == 3
    stats = core.stats()
    assert stats["acked"] == 31 and stats["promoted"] == 1 and stats["in_flight"] == 0
