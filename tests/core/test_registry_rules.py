"""The registry's rules, total: a valid configuration is never refused because of a value
another process recorded; the settings that change what a script writes (the bell) are
recorded and applied by whoever opens the queue without naming them; a queue's identity
holds its namespace; and a full server never keeps a queue from opening to drain it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from belayq import ConfigError, ReliableQueue, ShardedQueue
from belayq.discovery import Found, find, list_queues, open_found
from belayq.embedded import RedisServer
from belayq.keys import dramatiq_layout, registry_key, shard_names
from belayq.registry import Registry
from belayq.sharded_layout import recorded_shards
from tests.conftest import any_binary, client_of


def test_a_recorded_lease_shorter_than_my_heartbeat_does_not_refuse_my_valid_configuration(
    r: redis.Redis, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    ReliableQueue(r, qname, keeper=False, lease_ms=8_000)
    with caplog.at_level(logging.WARNING, logger="belayq"):
        q = ReliableQueue(r, qname, keeper=False, heartbeat_interval_ms=10_000)
    assert q.config.heartbeat_interval_ms == 10_000
    assert q.config.lease_ms > q.config.heartbeat_interval_ms  # its leases outlive a beat
    assert any("8000" in rec.getMessage() and "heartbeat_interval_ms" in rec.getMessage()
               for rec in caplog.records)
    rec = Registry(r).get("belayq", qname)
    assert rec is not None and rec.lease_ms == 8_000  # the record stays the fleet's
    other = ReliableQueue(r, qname, keeper=False)  # a process naming nothing still adopts it
    assert other.config.lease_ms == 8_000


@pytest.fixture(scope="module")
def full_server() -> Iterator[RedisServer]:
    """A server of this module's own, which its tests fill (maxmemory, noeviction)."""
    with RedisServer(any_binary(), args=["--maxmemory-policy", "noeviction"]) as server:
        yield server


@contextlib.contextmanager
def full(client: redis.Redis) -> Iterator[None]:
    """The server full: maxmemory below what it uses now."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", max(1, used - 200_000))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("probe", "x")  # the server refuses what stores more
    try:
        yield
    finally:
        client.config_set("maxmemory", 0)


def test_a_full_server_opens_a_queue_stock_producers_filled_so_it_drains(
    full_server: RedisServer, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    layout: dict[str, Any] = dramatiq_layout(qname)
    with client_of(full_server) as client:
        for i in range(3):  # as stock RedisBroker's enqueue: the body, then the id
            client.hset(layout["payloads_key"], f"id-{i}", f"body-{i}")
            client.rpush(layout["ready_key"], f"id-{i}")
        with full(client), caplog.at_level(logging.WARNING, logger="belayq"):
            q = ReliableQueue(client, qname, keeper=False, claim_starts=False, **layout)
            got = q.claim(timeout=0, count=3)
            assert sorted(d.payload for d in got) == [b"body-0", b"body-1", b"body-2"]
            assert q.ack_many(got) == [True] * 3
            assert q.stats()["ready"] == 0
        assert any("registry" in r.getMessage() and "memory" in r.getMessage()
                   for r in caplog.records)
        assert Registry(client).get("dramatiq", qname) is None  # recorded at the next open
        q.drop()


def test_a_full_server_opens_a_consumer_restarted_with_a_longer_lease(
    full_server: RedisServer, qname: str
) -> None:
    with client_of(full_server) as client:
        ReliableQueue(client, qname, keeper=False, lease_ms=5_000, max_deliveries=3)
        producer = ReliableQueue(client, qname, keeper=False)
        producer.publish(b"a")
        before = client.hget(registry_key(), f"belayq/{qname}")
        with full(client):
            q = ReliableQueue(client, qname, keeper=False, lease_ms=60_000)
            assert q.config.lease_ms == 60_000 and q.config.max_deliveries == 3
            [d] = q.claim(timeout=0)
            assert q.ack(d)
            with pytest.raises(ConfigError, match="laid out otherwise"):  # checked first
                ReliableQueue(client, qname, keeper=False, priority_steps=(0, 5))
        assert client.hget(registry_key(), f"belayq/{qname}") == before
        q.drop()


def test_two_dramatiq_apps_with_their_own_namespace_share_one_redis(
    r: redis.Redis, qname: str
) -> None:
    mine: dict[str, Any] = dramatiq_layout(qname)
    theirs: dict[str, Any] = dramatiq_layout(qname, namespace="app2")
    a = ReliableQueue(r, qname, keeper=False, max_deliveries=3, **mine)
    b = ReliableQueue(r, qname, keeper=False, max_deliveries=9, **theirs)
    assert (a.config.max_deliveries, b.config.max_deliveries) == (3, 9)
    assert Registry(r).get("dramatiq", qname).ready_key == f"dramatiq:{qname}"  # type: ignore[union-attr]
    rec = Registry(r).get("dramatiq", qname, namespace="app2")
    assert rec is not None and rec.ready_key == f"app2:{qname}" and rec.max_deliveries == 9
    listed = {(f.namespace, f.record.ready_key) for f in list_queues(r, kind="dramatiq")
              if f.name == qname and f.record is not None}
    assert listed == {("", f"dramatiq:{qname}"), ("app2", f"app2:{qname}")}
    with pytest.raises(ConfigError, match="--namespace"):
        find(r, qname, "dramatiq")
    tool = open_found(r, find(r, qname, "dramatiq", namespace="app2"))
    assert tool.keys.ready == f"app2:{qname}" and tool.config.max_deliveries == 9
    assert b.drop()  # forgets its own record only
    assert Registry(r).get("dramatiq", qname, namespace="app2") is None
    assert Registry(r).get("dramatiq", qname) is not None


def test_a_record_of_the_previous_form_is_read_under_its_namespace(
    r: redis.Redis, qname: str
) -> None:
    theirs: dict[str, Any] = dramatiq_layout(qname, namespace="app2")
    old = ReliableQueue(r, qname, keeper=False, record=False, **theirs).record()
    legacy = json.loads(dataclasses.replace(old, max_deliveries=7,
                                            named=("max_deliveries",)).to_json())
    legacy.pop("namespace", None)  # as the previous form wrote it, under kind/name
    r.hset(registry_key(), f"dramatiq/{qname}", json.dumps(legacy))
    assert Registry(r).get("dramatiq", qname, namespace="app2") is not None
    assert Registry(r).get("dramatiq", qname) is None  # not the default namespace's
    mine = ReliableQueue(r, qname, keeper=False, **dramatiq_layout(qname))  # not refused
    assert mine.keys.ready == f"dramatiq:{qname}"
    b = ReliableQueue(r, qname, keeper=False, **theirs)  # takes the limits it had recorded
    assert b.config.max_deliveries == 7
    recs = {(f.namespace, f.record.max_deliveries) for f in list_queues(r, kind="dramatiq")
            if f.name == qname and f.record is not None}
    assert recs == {("", 5), ("app2", 7)}


def test_the_command_names_one_of_two_apps_queues_by_its_namespace(
    r: redis.Redis, qname: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from belayq.cli import main

    ReliableQueue(r, qname, keeper=False, **dramatiq_layout(qname))
    theirs = ReliableQueue(r, qname, keeper=False, **dramatiq_layout(qname, namespace="app2"))
    theirs.publish_many([b"a", b"b"])
    url = f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}/0"
    assert main(["stats", "--url", url, qname, "--kind", "dramatiq"]) == 2
    assert "--namespace" in capsys.readouterr().err
    assert main(["stats", "--url", url, qname, "--kind", "dramatiq", "--namespace", "app2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ready"] == 2
    assert main(["queues", "--url", url, "--kind", "dramatiq"]) == 0
    out = capsys.readouterr().out
    assert "namespace" in out.splitlines()[0] and "app2" in out


def test_each_scrape_of_the_exporter_applies_the_record_as_it_stands(
    r: redis.Redis, qname: str
) -> None:
    import argparse

    from belayq.cli.serving import queue_openers

    ReliableQueue(r, qname, keeper=False, lease_ms=60_000, max_deliveries=3)
    args = argparse.Namespace(queue=[qname], kind="auto", prefix="belayq", namespace=None)
    [first] = [o() for o in queue_openers(r, args)]
    assert (first.config.lease_ms, first.config.max_deliveries) == (60_000, 3)
    ReliableQueue(r, qname, keeper=False, lease_ms=5_000, max_deliveries=20)  # a restart
    [later] = [o() for o in queue_openers(r, args)]
    assert (later.config.lease_ms, later.config.max_deliveries) == (5_000, 20)


def test_two_apps_queues_of_one_name_are_two_series_of_the_exporter(
    r: redis.Redis, qname: str
) -> None:
    pytest.importorskip("prometheus_client")
    from belayq.discovery import open_found as opened
    from belayq.metrics import QueueCollector

    ReliableQueue(r, qname, keeper=False, **dramatiq_layout(qname)).publish(b"a")
    ReliableQueue(r, qname, keeper=False,
                  **dramatiq_layout(qname, namespace="app2")).publish_many([b"b", b"c"])

    def queues() -> list[Any]:
        return [opened(r, f) for f in list_queues(r, kind="dramatiq") if f.name == qname]

    ready = {s.labels["queue"]: s.value for family in QueueCollector(queues).collect()
             if family.name == "belayq_ready" for s in family.samples}
    assert ready == {qname: 1, f"app2:{qname}": 2}


def test_a_record_of_the_previous_form_of_belayqs_own_dramatiq_keys_stays_in_its_place(
    r: redis.Redis, qname: str
) -> None:
    from belayq import ShardedQueue

    ShardedQueue(r, qname, shards=1, kind="dramatiq", keeper=False)  # belayq:dramatiq:{q}
    legacy = json.loads(r.hget(registry_key(), f"dramatiq/{qname}") or b"")
    legacy.pop("namespace")
    r.hset(registry_key(), f"dramatiq/{qname}", json.dumps(legacy))
    ShardedQueue(r, qname, shards=1, kind="dramatiq", keeper=False)
    fields = [f for f in r.hkeys(registry_key()) if qname.encode() in f]
    assert fields == [f"dramatiq/{qname}".encode()]
    assert [(f.namespace, f.name) for f in list_queues(r, kind="dramatiq")
            if f.name == qname] == [("", qname)]


def test_a_kombu_queue_only_a_prefixed_binding_table_knows_opens_on_that_prefix(
    r: redis.Redis, qname: str
) -> None:
    from belayq.keys import KOMBU_SEP, kombu_binding_key, kombu_layout

    prefix = f"{{{qname}}}:"
    ReliableQueue(r, "recorded", keeper=False, **kombu_layout("recorded", keyprefix=prefix))  # type: ignore[arg-type]
    Registry(r).note_facts("kombu", "recorded", {"keyprefix": prefix, "exchanges": ["celery"]},
                           prefix)
    r.sadd(kombu_binding_key("celery", prefix), KOMBU_SEP.join([qname, "", qname]))
    found = find(r, qname, "kombu")
    assert (found.namespace, found.recorded) == (prefix, False)
    assert open_found(r, found).keys.ready == f"{prefix}{qname}"
    assert [(f.namespace, f.name) for f in list_queues(r, kind="kombu")
            if f.name == qname] == [(prefix, qname)]


def test_a_sharded_queue_warns_once_of_a_recorded_lease_shorter_than_my_heartbeat(
    r: redis.Redis, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    ShardedQueue(r, qname, shards=4, keeper=False, lease_ms=8_000)
    with caplog.at_level(logging.WARNING, logger="belayq"):
        q = ShardedQueue(r, qname, shards=4, keeper=False, heartbeat_interval_ms=10_000)
    said = [rec.getMessage() for rec in caplog.records
            if "heartbeat_interval_ms" in rec.getMessage()]
    assert len(said) == 1, said
    assert f"queue {qname!r}" in said[0]  # the logical queue, not one of its shards
    assert all(s.config.lease_ms > 10_000 for s in q.shards)  # each shard keeps its own
    q.drop()


def test_a_full_server_opens_a_new_sharded_queue_so_it_drains(
    full_server: RedisServer, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    with client_of(full_server) as client:
        for name in shard_names(qname, 4):  # messages in its shards, no shard count recorded
            ReliableQueue(client, name, keeper=False, record=False).publish(name.encode())
        with full(client), caplog.at_level(logging.WARNING, logger="belayq"):
            q = ShardedQueue(client, qname, shards=4, keeper=False)
            got = q.claim(timeout=0, count=4)
            assert sorted(d.payload for d in got) == sorted(
                n.encode() for n in shard_names(qname, 4))
            assert q.ack_many(got) == [True] * 4
            ShardedQueue(client, qname, shards=4, keeper=False)  # warned once, not again
        said = [rec.getMessage() for rec in caplog.records if "shard count" in rec.getMessage()]
        assert len(said) == 1 and "full" in said[0], said
        assert recorded_shards(client, qname) == 1  # recorded by the next open with room
        q = ShardedQueue(client, qname, shards=4, keeper=False)
        assert recorded_shards(client, qname) == 4
        with full(client), pytest.raises(ConfigError, match="sharded over 4"):  # checked first
            ShardedQueue(client, qname, shards=2, keeper=False)
        q.drop()


def test_a_dramatiq_queue_is_known_by_its_record_only_in_its_own_namespace(
    r: redis.Redis, qname: str
) -> None:
    stock = dramatiq_layout(qname, namespace="app2")  # as stock RedisBroker's enqueue
    r.hset(stock["payloads_key"], "id-1", "body-1")
    r.rpush(stock["ready_key"], "id-1")
    assert all(f.name != qname for f in list_queues(r))  # Dramatiq keeps no set of queues
    with pytest.raises(LookupError):
        find(r, qname, "dramatiq", namespace="app2")
    unrecorded = open_found(r, Found("dramatiq", qname, namespace="app2"))  # were it named
    assert isinstance(unrecorded, ReliableQueue)
    assert unrecorded.keys.ready == stock["ready_key"]
    ReliableQueue(r, qname, keeper=False, **stock)  # as belayq_dramatiq opens it
    found = find(r, qname, "dramatiq")
    assert found.namespace == "app2"
    q = open_found(r, found)
    assert isinstance(q, ReliableQueue) and q.keys.ready == stock["ready_key"]
    [d] = q.claim(timeout=0)
    assert d.payload == b"body-1"  # from its own app's lists
    q.drop()


class _WritesBetween:
    """A client that, right after one HSET of ``field``, lets another process write
    (``then``): the interleaving of two processes opening at once."""

    def __init__(self, client: redis.Redis, field: str, then: Any) -> None:
        self._client, self._field, self._then = client, field, then

    def hset(self, key: Any, field: Any, *args: Any, **kwargs: Any) -> Any:
        done = self._client.hset(key, field, *args, **kwargs)
        if field == self._field and self._then is not None:
            then, self._then = self._then, None
            then()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_moving_a_record_of_the_previous_form_keeps_one_another_process_wrote_meanwhile(
    r: redis.Redis, qname: str
) -> None:
    theirs: dict[str, Any] = dramatiq_layout(qname, namespace="app2")
    old = ReliableQueue(r, qname, keeper=False, record=False, **theirs).record()
    legacy = json.loads(old.to_json())
    legacy.pop("namespace", None)  # as the previous form wrote it, under kind/name
    r.hset(registry_key(), f"dramatiq/{qname}", json.dumps(legacy))
    default = ReliableQueue(r, qname, keeper=False, record=False,
                            **dramatiq_layout(qname)).record()

    def default_app_records() -> None:  # it moved the old record and wrote its own
        r.hset(registry_key(), f"dramatiq/{qname}", default.to_json())

    racing = Registry(_WritesBetween(r, f"dramatiq:app2/{qname}", default_app_records))
    racing.record(old)
    assert Registry(r).get("dramatiq", qname, namespace="app2") is not None
    kept = Registry(r).get("dramatiq", qname)
    assert kept is not None and kept.namespace == "" and kept.ready_key == default.ready_key


def test_a_default_opener_moving_the_previous_form_keeps_a_record_written_meanwhile(
    r: redis.Redis, qname: str
) -> None:
    theirs: dict[str, Any] = dramatiq_layout(qname, namespace="app2")
    old = ReliableQueue(r, qname, keeper=False, record=False, **theirs).record()
    legacy = json.loads(old.to_json())
    legacy.pop("namespace", None)  # as the previous form wrote it, under kind/name
    r.hset(registry_key(), f"dramatiq/{qname}", json.dumps(legacy))
    default = ReliableQueue(r, qname, keeper=False, record=False,
                            **dramatiq_layout(qname)).record()
    other = dataclasses.replace(default, max_deliveries=11, named=("max_deliveries",))

    class Between(_WritesBetween):  # another default opener records once the move began
        def hsetnx(self, key: Any, field: Any, value: Any) -> Any:
            done = self._client.hsetnx(key, field, value)
            if field == f"dramatiq:app2/{qname}":
                r.hset(registry_key(), f"dramatiq/{qname}", other.to_json())
            return done

    Registry(Between(r, "", None)).record(default)
    kept = Registry(r).get("dramatiq", qname)
    assert kept is not None and kept.max_deliveries == 11  # the other opener's, not lost
    assert Registry(r).get("dramatiq", qname, namespace="app2") is not None
