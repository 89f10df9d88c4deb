"""The queue registry on a real server: opening a queue records its kind, layout and limits;
a process that names no limit takes the recorded ones; a new limit replaces the recorded one
loudly; another layout is refused; tools open a queue as recorded and write nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from belayq import ConfigError, ReliableQueue, ShardedQueue
from belayq.discovery import Found, find, list_queues, open_found
from belayq.keys import kombu_layout, registry_key, rq_layout
from belayq.registry import Registry


def test_opening_a_queue_records_its_kind_layout_and_limits(r: redis.Redis, qname: str) -> None:
    ReliableQueue(r, qname, keeper=False, lease_ms=7_000, max_deliveries=9)
    rec = Registry(r).get("belayq", qname)
    assert rec is not None and rec.ready_key is None and rec.shards == 1
    assert (rec.lease_ms, rec.max_deliveries, rec.dead_letter_max) == (7_000, 9, 10_000)
    assert set(rec.named) == {"lease_ms", "max_deliveries"}
    kombu = ReliableQueue(r, qname, keeper=False, **kombu_layout(qname))  # type: ignore[arg-type]
    assert kombu.kind == "kombu"
    rec = Registry(r).get("kombu", qname)
    assert rec is not None and rec.ready_key == qname and rec.priority_steps == (0, 3, 6, 9)


def test_a_process_that_names_no_limit_takes_the_recorded_ones(r: redis.Redis, qname: str) -> None:
    ReliableQueue(r, qname, keeper=False, lease_ms=4_000, dead_letter_max=20_000)
    producer = ReliableQueue(r, qname, keeper=False)
    assert producer.config.lease_ms == 4_000 and producer.config.dead_letter_max == 20_000
    assert producer.config.max_deliveries == 5  # nobody named it: belayq's default


def test_defaults_recorded_by_a_producer_give_way_quietly(
    r: redis.Redis, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    ReliableQueue(r, qname, keeper=False)  # a producer: names nothing
    with caplog.at_level(logging.WARNING, logger="belayq"):
        consumer = ReliableQueue(r, qname, keeper=False, lease_ms=2_000)
    assert consumer.config.lease_ms == 2_000 and not caplog.records
    rec = Registry(r).get("belayq", qname)
    assert rec is not None and rec.lease_ms == 2_000


def test_a_named_limit_replaces_another_named_one_with_a_warning(
    r: redis.Redis, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    ReliableQueue(r, qname, keeper=False, max_deliveries=5)
    with caplog.at_level(logging.WARNING, logger="belayq"):
        ReliableQueue(r, qname, keeper=False, max_deliveries=20)
    [warning] = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert "max_deliveries 5 -> 20" in warning.getMessage()
    rec = Registry(r).get("belayq", qname)
    assert rec is not None and rec.max_deliveries == 20 and rec.changed_by


def test_another_layout_is_refused_and_changes_nothing(r: redis.Redis, qname: str) -> None:
    ReliableQueue(r, qname, keeper=False, priority_steps=(0, 5))
    before = r.hget(registry_key(), f"belayq/{qname}")
    with pytest.raises(ConfigError, match="laid out otherwise"):
        ReliableQueue(r, qname, keeper=False, priority_steps=(0, 3, 6))
    with pytest.raises(ConfigError, match="ready_head"):
        ReliableQueue(r, qname, keeper=False, priority_steps=(0, 5), ready_head="left")
    assert r.hget(registry_key(), f"belayq/{qname}") == before


def test_a_sharded_queue_is_recorded_once_under_its_own_name(r: redis.Redis, qname: str) -> None:
    ShardedQueue(r, qname, shards=3, keeper=False, lease_ms=3_000)
    records = [rec for rec in Registry(r).all() if qname in rec.name]
    assert [(rec.name, rec.shards, rec.lease_ms) for rec in records] == [(qname, 3, 3_000)]
    q = open_found(r, find(r, qname))
    assert isinstance(q, ShardedQueue) and q.config.lease_ms == 3_000


def test_tools_open_a_queue_as_recorded_and_write_nothing(r: redis.Redis, qname: str) -> None:
    layout: dict[str, Any] = rq_layout(qname)
    ReliableQueue(r, qname, keeper=False, lease_ms=20_000, exhausted="deliver", **layout)
    before = r.hgetall(registry_key())
    q = open_found(r, find(r, qname, "rq"))
    assert q.config.lease_ms == 20_000 and q.config.exhausted == "deliver"
    assert q.keys.ready == f"rq:queue:{qname}" and q.limits_known
    assert r.hgetall(registry_key()) == before


def test_listing_and_finding_read_the_registry_and_the_frameworks(
    r: redis.Redis, qname: str
) -> None:
    ReliableQueue(r, qname, keeper=False)
    r.sadd("rq:queues", f"rq:queue:{qname}-rq")
    listed = {(f.kind, f.name): f.recorded for f in list_queues(r) if qname in f.name}
    assert listed == {("belayq", qname): True, ("rq", f"{qname}-rq"): False}
    assert find(r, f"{qname}-rq") == Found("rq", f"{qname}-rq")
    assert [f.name for f in list_queues(r, kind="rq") if qname in f.name] == [f"{qname}-rq"]


def test_a_name_taken_by_two_kinds_must_be_named_with_its_kind(r: redis.Redis, qname: str) -> None:
    ReliableQueue(r, qname, keeper=False)
    ReliableQueue(r, qname, keeper=False, **kombu_layout(qname))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--kind"):
        find(r, qname)
    assert find(r, qname, "kombu").kind == "kombu"


def test_an_acl_user_refused_the_registry_is_warned_and_its_queue_works(
    r: redis.Redis, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    user = f"noreg-{qname}"
    r.acl_setuser(user, enabled=True, passwords=["+pw"], keys=[f"belayq:{{{qname}}}:*"],
                  commands=["+@all"])
    try:
        port = r.connection_pool.connection_kwargs["port"]
        limited = redis.Redis(port=port, username=user, password="pw")
        with caplog.at_level(logging.WARNING, logger="belayq"):
            q = ReliableQueue(limited, qname, keeper=False)
            q.publish(b"x")
            [d] = q.claim(timeout=0)
            assert q.ack(d)
        assert any("belayq:queues" in rec.getMessage() and "ACL" in rec.getMessage()
                   for rec in caplog.records)
        assert Registry(r).get("belayq", qname) is None
    finally:
        r.acl_deluser(user)
