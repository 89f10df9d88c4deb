"""The bell a Celery fleet turned off (``priority_bell=False``, stock workers pop the same
lists) is recorded with the queue, so that a producer that does not name it, ``belayq
replay`` and the recovery pass of a tool never put the wake-up entry into a list a stock
worker pops: every entry of the stock lists stays a kombu JSON envelope, and a stock
consumer takes the message."""

from __future__ import annotations

import json
from typing import Any

import kombu
import redis

from belayq.cli import main
from belayq.discovery import find, open_found
from belayq.keys import KOMBU_SEP, KOMBU_STEPS
from belayq.registry import Registry


def _entries(client: redis.Redis, kq: str) -> list[bytes]:
    lists = [kq] + [f"{kq}{KOMBU_SEP}{s}" for s in KOMBU_STEPS[1:]]
    return [e for name in lists for e in client.lrange(name, 0, -1)]


def _all_kombu_json(client: redis.Redis, kq: str) -> list[Any]:
    return [json.loads(e) for e in _entries(client, kq)]  # a bell entry raises here


def test_a_fleet_with_the_bell_off_never_gets_a_bell_from_producers_or_tools(
    url: str, stock_url: str, port: int, kq: str
) -> None:
    client = redis.Redis(port=port)
    with kombu.Connection(url, transport_options={"priority_bell": False}) as worker:
        q = worker.SimpleQueue(kq)
        rec = Registry(client).get("kombu", kq)
        assert rec is not None and rec.bell is False
        with kombu.Connection(url) as producer:  # names no bell: takes the recorded one
            p = producer.SimpleQueue(kq)
            p.put({"n": 1}, priority=7)
            p.close()
        assert len(_all_kombu_json(client, kq)) == 1
        rec = Registry(client).get("kombu", kq)
        assert rec is not None and rec.bell is False
        m = q.get(timeout=5)
        m.reject(requeue=False)  # dead-lettered
        q.close()
    tool = open_found(client, find(client, kq, "kombu"))
    assert tool.config.bell is False and tool.stats()["dead"] == 1
    assert main(["replay", "--url", stock_url, kq, "--kind", "kombu", "--all"]) == 0
    tool.sweep()
    envelopes = _all_kombu_json(client, kq)
    assert len(envelopes) == 1 and envelopes[0]["properties"]["priority"] == 7
    with kombu.Connection(stock_url) as stock:  # a stock consumer of the same lists
        s = stock.SimpleQueue(kq)
        got = s.get(timeout=5)
        assert got.payload == {"n": 1}
        got.ack()
        s.close()
    client.close()


def test_two_celery_apps_apart_by_their_global_keyprefix_share_one_redis(
    url: str, port: int, kq: str
) -> None:
    client = redis.Redis(port=port)
    # A key prefix with a hash tag keeps the registry under belayq's own prefix: both
    # apps' records meet in one hash, told apart by their namespace.
    apps = [{"global_keyprefix": "{app1}:", "max_deliveries": 3},
            {"global_keyprefix": "{app2}:", "max_deliveries": 9}]
    for options in apps:
        with kombu.Connection(url, transport_options=options) as conn:
            q = conn.SimpleQueue(kq)
            q.put({"app": options["global_keyprefix"]})
            q.close()
    for options in apps:
        prefix = str(options["global_keyprefix"])
        rec = Registry(client).get("kombu", kq, namespace=prefix)
        assert rec is not None and rec.ready_key == f"{prefix}{kq}"
        assert rec.max_deliveries == options["max_deliveries"]
        tool = open_found(client, find(client, kq, "kombu", namespace=prefix))
        assert tool.stats()["ready"] == 1
        with kombu.Connection(url, transport_options=options) as conn:
            q = conn.SimpleQueue(kq)
            m = q.get(timeout=5)
            assert m.payload == {"app": prefix}
            m.ack()
            q.close()
    client.close()
