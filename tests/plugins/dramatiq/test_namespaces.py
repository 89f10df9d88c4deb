"""Two Dramatiq apps on one Redis, apart by their ``namespace`` as stock RedisBroker lets
them be: each app's queue of one name is its own queue, recorded with its own limits, and
each broker takes only its own messages."""

from __future__ import annotations

import dramatiq
import redis

from belayq.registry import Registry
from belayq_dramatiq import Broker


def test_two_apps_apart_by_their_namespace_each_run_their_own_queue(conn: redis.Redis) -> None:
    mine = Broker(client=conn, max_deliveries=3)
    theirs = Broker(client=conn, namespace="app2", max_deliveries=9)
    for broker in (mine, theirs):
        broker.declare_queue("default")
    assert Registry(conn).get("dramatiq", "default").max_deliveries == 3  # type: ignore[union-attr]
    assert Registry(conn).get("dramatiq", "default", "app2").max_deliveries == 9  # type: ignore[union-attr]
    for broker, text in ((mine, "mine"), (theirs, "theirs")):
        broker.enqueue(dramatiq.Message(queue_name="default", actor_name="a", args=(text,),
                                        kwargs={}, options={}))
    for broker, text in ((mine, "mine"), (theirs, "theirs")):
        consumer = broker.consume("default", prefetch=1, timeout=100)
        got = next(iter(consumer))
        assert got is not None and got.args == (text,)
        consumer.ack(got)
        assert next(iter(consumer)) is None
        consumer.close()
    for broker in (mine, theirs):
        broker.close()
