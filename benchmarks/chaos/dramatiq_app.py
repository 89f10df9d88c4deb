"""The Dramatiq side of the chaos workers (``dramatiq benchmarks.chaos.dramatiq_app``): the
actor and the broker, configured from the environment the harness sets:
``CHAOS_DRAMATIQ`` (``belayq``, ``belayq-shards`` or ``stock``), ``CHAOS_BROKER``,
``CHAOS_BROKER_SPEC`` (the topology: one server, a Sentinel group or a cluster),
``CHAOS_QUEUE``, ``CHAOS_LEASE_MS``, ``CHAOS_SWEEP_MS``, ``CHAOS_MAX_DELIVERIES``,
``CHAOS_WAIT_REPLICAS``."""

from __future__ import annotations

import json
import os
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from .ledger import run_task
from .servers import BrokerSpec

_env = os.environ.get
ACTOR = "work"


def spec_env(spec: BrokerSpec) -> str:
    """``spec`` as ``CHAOS_BROKER_SPEC`` carries it to the workers."""
    return json.dumps({"kind": spec.kind, "port": spec.port, "sentinels": spec.sentinels,
                       "service_name": spec.service_name, "cluster_nodes": spec.cluster_nodes})


def client_of(raw: str, name: str) -> Any | None:
    """A client of the topology ``CHAOS_BROKER_SPEC`` names: Sentinel-managed, or a
    ``RedisCluster``; None for one server (the broker takes its URL)."""
    got = json.loads(raw)
    spec = BrokerSpec(
        got["kind"], port=got["port"], sentinels=tuple(tuple(s) for s in got["sentinels"]),
        service_name=got["service_name"],
        cluster_nodes=tuple(tuple(n) for n in got["cluster_nodes"]),
    )  # fmt: skip
    return None if spec.kind == "single" else spec.client(name, socket_timeout=5)


def make_broker(kind: str, url: str, client: Any | None = None) -> dramatiq.Broker:
    """The stack's broker: stock ``RedisBroker``, or ``belayq_dramatiq.Broker`` (in stock's
    keys; with ``belayq-shards``, in belayq's own over 3 shards), on ``client`` when given
    (Sentinel, Cluster), else on ``url``."""
    where: dict[str, Any] = {"url": url} if client is None else {"client": client}
    if kind == "stock":
        return RedisBroker(**where)  # type: ignore[no-untyped-call]
    from belayq_dramatiq import Broker

    return Broker(
        **where,
        lease_ms=int(_env("CHAOS_LEASE_MS", "5000")),
        max_deliveries=int(_env("CHAOS_MAX_DELIVERIES", "50")),
        belayq_options={
            "sweep_interval_ms": int(_env("CHAOS_SWEEP_MS", "500")),
            "wait_replicas": int(_env("CHAOS_WAIT_REPLICAS", "0")),
        },
        shards=3 if kind == "belayq-shards" else None,
    )


if "CHAOS_BROKER" in os.environ:  # a worker (the harness's own process imports make_broker)
    broker = make_broker(_env("CHAOS_DRAMATIQ", "belayq"), os.environ["CHAOS_BROKER"],
                         client_of(_env("CHAOS_BROKER_SPEC", ""), "chaos-worker")
                         if _env("CHAOS_BROKER_SPEC") else None)
    dramatiq.set_broker(broker)

    @dramatiq.actor(actor_name=ACTOR, queue_name=_env("CHAOS_QUEUE", "default"),
                    max_retries=0, time_limit=3_600_000)
    def work(task_id: str, seconds: float) -> str:
        return run_task(task_id, seconds)
