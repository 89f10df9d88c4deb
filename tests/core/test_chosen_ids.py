"""A framework's own ids and its own bodies' hash: ``publish_result(message_id=...)`` and
``ReliableQueue(payloads_key=...)``, the layout of a list of ids beside a hash of bodies
(Dramatiq's ``<list>`` and ``<list>.msgs``). The claim returns the bodies, the ack deletes
them in its script, a stale ack leaves them, and an id already in the queue stores
nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from belayq import ConfigError, ReliableQueue
from belayq.discovery import find, open_found
from belayq.keys import QueueKeys
from belayq.metrics import published_ms_of_entry
from tests.conftest import make_client


@pytest.fixture(params=[("redis", None), ("redis", False), ("redis62", None)],
                ids=["redis-functions", "redis-scripts", "redis62"])
def ids_queue(request: pytest.FixtureRequest, make_queue: Any, qname: str) -> ReliableQueue:
    backend, functions = request.param
    client = make_client(request, backend)
    request.addfinalizer(client.close)
    return make_queue(client, ready_key=f"fw:{qname}", payloads_key=f"fw:{qname}.msgs",
                      ready_head="left", kind="dramatiq", lease_ms=LEASE_MS,
                      lua_functions=functions)


LEASE_MS = 300


def bodies(q: ReliableQueue) -> dict[bytes, bytes]:
    return {bytes(k): bytes(v) for k, v in q.client.hgetall(q.keys.payloads).items()}


def test_the_body_goes_in_the_framework_hash_under_the_chosen_id(ids_queue: ReliableQueue
                                                                ) -> None:
    q = ids_queue
    published = q.publish_result(b"body-1", message_id="m-1")
    assert (published.id, published.stored) == ("m-1", True)
    assert q.client.lrange(q.keys.ready, 0, -1) == [b"m-1"]
    assert bodies(q) == {b"m-1": b"body-1"}
    assert not q.client.exists(f"{{{q.keys.ready}}}:payloads")


def test_the_claim_returns_the_body_and_the_ack_deletes_it(ids_queue: ReliableQueue) -> None:
    q = ids_queue
    q.publish_result(b"body-1", message_id="m-1")
    # a stock producer's message: its body, then its id, and nothing of the core's
    q.client.hset(q.keys.payloads, "m-2", b"body-2")
    q.client.rpush(q.keys.ready, "m-2")
    got = q.claim(timeout=0, count=10)
    assert [(d.id, d.payload) for d in got] == [("m-1", b"body-1"), ("m-2", b"body-2")]
    assert q.ack(got[0]) and q.ack(got[1])
    assert bodies(q) == {}
    assert q.stats()["in_flight"] == 0


def test_a_stale_ack_leaves_the_body_for_the_copy_that_holds_it(ids_queue: ReliableQueue
                                                                ) -> None:
    q = ids_queue
    q.publish_result(b"body-1", message_id="m-1")
    [first] = q.claim(timeout=0)
    q.forget([first])
    time.sleep(LEASE_MS * 2 / 1000)
    q.sweep()  # the lease ran out: m-1 is ready again
    [second] = q.claim(timeout=0)
    assert second.id == "m-1" and second.deliveries == 2
    assert not q.ack(first)
    assert bodies(q) == {b"m-1": b"body-1"}
    assert q.ack(second)
    assert bodies(q) == {}


@pytest.mark.parametrize("state", ["ready", "in_flight", "delayed", "dead"])
def test_an_id_in_the_queue_stores_nothing_and_says_where_it_is(
    ids_queue: ReliableQueue, state: str
) -> None:
    q = ids_queue
    q.publish_result(b"body-1", message_id="m-1", delay_ms=60_000 if state == "delayed" else 0)
    if state in ("in_flight", "dead"):
        [d] = q.claim(timeout=0)
        if state == "dead":
            assert q.dead_letter(d, "given up")
    before = q.stats()
    again = q.publish_result(b"other body", message_id="m-1")
    assert (again.id, again.stored, again.state) == ("m-1", False, state)
    assert bodies(q) == {b"m-1": b"body-1"}
    after = q.stats()
    assert {k: after[k] for k in ("ready", "delayed", "in_flight", "dead")} == {
        k: before[k] for k in ("ready", "delayed", "in_flight", "dead")}


def test_an_acked_id_may_be_published_again(ids_queue: ReliableQueue) -> None:
    q = ids_queue
    q.publish_result(b"body-1", message_id="m-1")
    [d] = q.claim(timeout=0)
    assert q.ack(d)
    again = q.publish_result(b"body-2", message_id="m-1")
    assert again.stored
    [d] = q.claim(timeout=0)
    assert d.payload == b"body-2" and d.deliveries == 1


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "é", 7, b"bytes"],
                         ids=["empty", "a space", "too long", "not ascii", "an int", "bytes"])
def test_a_bad_message_id_is_refused_and_nothing_is_stored(ids_queue: ReliableQueue, bad: Any
                                                           ) -> None:
    q = ids_queue
    with pytest.raises(ConfigError, match="message_id must be"):
        q.publish_result(b"body", message_id=bad)
    assert q.stats()["ready"] == 0 and bodies(q) == {}


def test_an_inline_queue_refuses_a_chosen_id(make_queue: Any, client: redis.Redis,
                                             qname: str) -> None:
    q = make_queue(client, ready_key=f"rq:queue:{qname}", payload_in_list=True)
    with pytest.raises(ConfigError, match="message_id is for queues whose list holds ids"):
        q.publish_result(b"job-id", message_id="m-1")
    assert q.stats()["ready"] == 0


@pytest.mark.parametrize("options, match", [
    ({"payloads_key": "h"}, "beside an adopted ready list"),
    ({"ready_key": "fw:q", "payloads_key": "fw:q"}, "none of the queue's other keys"),
    ({"ready_key": "fw:q", "payloads_key": "{fw:q}:meta"}, "none of the queue's other keys"),
    ({"ready_key": "fw:q", "payloads_key": ""}, "payloads_key must be"),
    ({"ready_key": "fw:q", "payloads_key": "fw:q.msgs", "payload_in_list": True},
     "needs payload_in_list=False"),
], ids=["no ready list", "the ready list", "a companion key", "empty", "inline"])
def test_a_payloads_key_that_does_not_fit_is_refused(
    make_queue: Any, client: redis.Redis, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        make_queue(client, **options)
    assert client.hgetall("belayq:queues") == {}


def test_the_keys_build_with_the_framework_hash(qname: str) -> None:
    keys = QueueKeys.build(qname, ready_key="fw:q", payloads_key="fw:q.msgs")
    assert keys.payloads == "fw:q.msgs" and keys.meta == "{fw:q}:meta"
    assert "fw:q.msgs" in keys.all_keys()


def test_the_tools_open_the_queue_with_its_recorded_hash(ids_queue: ReliableQueue) -> None:
    q = ids_queue
    q.publish_result(b'{"message_timestamp": 1700000000000}', message_id="m-1")
    found = find(q.client, q.name)
    assert found.record is not None and found.record.payloads_key == q.keys.payloads
    tool = open_found(q.client, found)
    assert tool.keys.payloads == q.keys.payloads
    assert tool.stats()["ready"] == 1
    # a foreign id tells no publish time: the framework's tools read it from the body
    assert published_ms_of_entry(tool, b"m-1") == 1700000000000.0


def test_a_process_with_another_hash_is_refused(ids_queue: ReliableQueue, make_queue: Any
                                                ) -> None:
    q = ids_queue
    with pytest.raises(ConfigError, match="payloads_key"):
        make_queue(q.client, ready_key=q.keys.ready, payloads_key=f"{q.keys.ready}.other",
                   ready_head="left", kind="dramatiq")
