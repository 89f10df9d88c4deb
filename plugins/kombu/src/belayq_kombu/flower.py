"""Flower on ``belayq://``: its Broker tab, ``/api/queues/length`` and the workers' queue
lengths.

Flower picks the client it counts queue lengths with by the scheme of the Celery
connection's URL, and knows ``redis``, ``rediss``, ``sentinel`` and ``amqp``; for
``belayq://`` (or ``broker_transport = "belayq"``) it answers "'redis' broker is not
supported". Import this module where Flower runs (its ``flowerconfig.py``, or the Celery
app module Flower loads) and Flower reads belayq's queues, counting as ``belayq`` does:
every priority level's list, without the wake-up entry (the priority bell) and without the
messages claimed or waiting for an ETA (as Flower counts stock Redis, which holds those
outside the lists too).

``belayq+sentinel://`` counts on the primary the sentinels name (``master_name`` and
``sentinel_kwargs`` from ``broker_transport_options``, as Flower's own ``sentinel://``);
``belayq+cluster://`` counts through a cluster client (each queue's lists share one slot).
Flower hands over the first URL only: with several sentinels or cluster nodes, the first
must answer.

Tested with Flower 2.x (``tests/plugins/kombu/test_tools.py``). It replaces nothing
Flower does for other schemes.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import redis

from belayq import ReliableQueue
from belayq.keys import KOMBU_SEP, KOMBU_STEPS, kombu_layout

from . import ALIASES, SCHEMES, topology

#: The redis-py scheme of each belayq scheme.
_REDIS_SCHEME = {"belayq": "redis", "belayqs": "rediss"}


def ready_counts(client: Any, names: list[str], options: dict[str, Any]) -> list[int]:
    """Messages waiting in each kombu queue of ``names`` (every priority level, the bell
    left out), laid out as ``options`` (Celery's ``broker_transport_options``) say."""
    steps = tuple(options.get("priority_steps", KOMBU_STEPS))
    layout = {"steps": steps, "keyprefix": options.get("global_keyprefix", ""),
              "sep": options.get("sep", KOMBU_SEP), "cluster": hasattr(client, "nodes_manager")}
    return [sum(ReliableQueue(client, name, keeper=False,
                              record=False, **kombu_layout(name, **layout)).ready_by_level())  # type: ignore[arg-type]
            for name in names]


class BelayqBroker:
    """Flower's broker interface (``queues(names)``) over belayq's counts."""

    def __init__(self, url: str, options: dict[str, Any], ssl: Any = None) -> None:
        kwargs: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}
        if isinstance(ssl, dict):
            kwargs.update(ssl)
        self.options = options
        scheme = urlsplit(url).scheme
        if scheme in ALIASES:
            self.client = _ha_client(url, options, kwargs)
        else:
            self.client = redis.Redis.from_url(_REDIS_SCHEME[scheme] + url[len(scheme):],
                                               **kwargs)

    async def queues(self, names: Any) -> list[dict[str, Any]]:
        names = list(names)
        try:
            counts = await asyncio.to_thread(ready_counts, self.client, names, self.options)
        finally:
            self.client.close()
        return [{"name": n, "messages": c} for n, c in zip(names, counts, strict=True)]


def _ha_client(url: str, options: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """A client of the cluster, or of the primary the sentinels name, for ``url``."""
    place = topology.parse_url(url)
    kwargs = {**kwargs, "username": place.username, "password": place.password}
    if place.tls:
        kwargs["ssl"] = True
    if place.kind == topology.CLUSTER:
        from redis.cluster import RedisCluster

        return RedisCluster(startup_nodes=topology.startup_nodes(place.nodes), **kwargs)
    from redis.sentinel import Sentinel

    sentinel = Sentinel(list(place.nodes),  # type: ignore[no-untyped-call]
                        sentinel_kwargs=options.get("sentinel_kwargs"),
                        min_other_sentinels=int(options.get("min_other_sentinels") or 0),
                        db=place.db, **kwargs)
    if not options.get("master_name"):
        raise ValueError("belayq+sentinel:// needs the transport option 'master_name'")
    return sentinel.master_for(options["master_name"])  # type: ignore[no-untyped-call]


def install() -> bool:
    """Teach Flower's Broker factory the belayq schemes; False when Flower is not installed."""
    try:
        from flower.utils import broker  # type: ignore[import-untyped]
    except ImportError:
        return False
    factory = broker.Broker
    if getattr(factory, "_belayq", False):
        return True
    original = factory.__new__

    def __new__(cls: type, broker_url: str, *args: Any, **kwargs: Any) -> Any:
        scheme = urlsplit(broker_url).scheme
        if scheme in SCHEMES or scheme in ALIASES:
            return BelayqBroker(broker_url, kwargs.get("broker_options") or {},
                                kwargs.get("broker_use_ssl"))
        return original(cls, broker_url, *args, **kwargs)

    factory.__new__ = staticmethod(__new__)
    factory._belayq = True
    return True


install()
