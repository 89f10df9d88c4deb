"""The tools find the kombu queues a belayq:// process declared, and the queues only stock
producers fill that are bound to the same exchanges, through belayq's registry and kombu's
binding tables; the Celery adapter records its queues under its ``global_keyprefix``."""

from __future__ import annotations

import uuid

import kombu
import redis

from belayq.discovery import find, list_queues
from belayq.registry import Registry


def test_a_stock_queue_bound_to_an_exchange_belayq_saw_is_found(port: int) -> None:
    tag = uuid.uuid4().hex[:8]
    exchange = kombu.Exchange(f"tasks-{tag}", type="direct")
    ours, theirs = (kombu.Queue(f"{n}-{tag}", exchange, routing_key=f"{n}-{tag}")
                    for n in ("ours", "theirs"))
    with kombu.Connection(f"belayq://127.0.0.1:{port}/0") as conn:
        conn.Producer().publish({"a": 1}, exchange=exchange, routing_key=ours.routing_key,
                                declare=[ours])
    with kombu.Connection(f"redis://127.0.0.1:{port}/0") as conn:  # stock, never belayq
        conn.Producer().publish({"b": 2}, exchange=exchange, routing_key=theirs.routing_key,
                                declare=[theirs])
    client = redis.Redis(port=port)
    found = {(f.name, f.recorded) for f in list_queues(client, kind="kombu") if tag in f.name}
    assert found == {(ours.name, True), (theirs.name, False)}
    rec = Registry(client).get("kombu", ours.name)
    assert rec is not None and rec.facts["exchanges"] == [exchange.name]
    assert find(client, theirs.name).kind == "kombu"


def test_a_global_keyprefix_keeps_the_registry_under_it(port: int) -> None:
    tag = uuid.uuid4().hex[:8]
    q = kombu.Queue(f"pre-{tag}", kombu.Exchange(f"pre-{tag}"), routing_key=f"pre-{tag}")
    with kombu.Connection(f"belayq://127.0.0.1:{port}/0",
                          transport_options={"global_keyprefix": f"app{tag}:"}) as conn:
        conn.Producer().publish({"a": 1}, exchange=q.exchange, routing_key=q.routing_key,
                                declare=[q])
    client = redis.Redis(port=port)
    [found] = list_queues(client, prefix=f"app{tag}:belayq", kind="kombu")
    assert found.name == q.name and found.record is not None
    assert found.record.ready_key == f"app{tag}:{q.name}"
    assert not any(f.name == q.name for f in list_queues(client, kind="kombu"))
