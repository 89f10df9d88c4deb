"""The Dramatiq stacks: ``dramatiq-belayq`` (``belayq_dramatiq.Broker``),
``dramatiq-belayq-shards`` (the same with ``shards=3``) and ``dramatiq-stock``
(``RedisBroker``), on one server, a Sentinel group (a Sentinel-managed client) or a
cluster (a ``RedisCluster``; not stock's, whose scripts Redis Cluster refuses). Workers
are real ``dramatiq`` commands, one worker process each with ``concurrency`` threads; a
worker process killed takes its command down (as Dramatiq's CLI does), and the harness
starts a new one, as a supervisor would."""

from __future__ import annotations

import sys
from typing import Any

import dramatiq

from .stacks import Stack, StackConfig


class DramatiqStack(Stack):
    framework = "dramatiq"
    ready_marker = "Worker process is ready for action."
    kind = ""

    @classmethod
    def unsupported(cls, cfg: StackConfig) -> str | None:
        if cfg.broker.kind == "cluster" and cls.kind == "stock":
            return ("stock RedisBroker's Lua scripts build their keys inside the script, "
                    "which Redis Cluster refuses")
        if cfg.wait_replicas and cls.kind == "stock":
            return "--wait-replicas is a belayq option (stock RedisBroker has none)"
        return None

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__(cfg)
        from .dramatiq_app import make_broker

        # the producer's client is named as the harness's (client-kill spares it), as
        # Celery's is; on one server the broker takes the URL, as before
        client = None if cfg.broker.kind == "single" else self.admin_client(
            "producer", socket_timeout=5)
        self.broker = make_broker(self.kind, self.broker_url, client)
        self.broker.declare_queue(cfg.queue)

    def env(self) -> dict[str, str]:
        from .dramatiq_app import spec_env

        return {**super().env(), "CHAOS_BROKER": self.broker_url, "CHAOS_DRAMATIQ": self.kind,
                "CHAOS_BROKER_SPEC": spec_env(self.cfg.broker)}

    def worker_cmd(self, name: str) -> list[str]:
        return [sys.executable, "-m", "dramatiq", "benchmarks.chaos.dramatiq_app",
                "--processes", "1", "--threads", str(self.cfg.concurrency),
                "--queues", self.cfg.queue]

    def publish(self, task_id: str, seconds: float, delay_s: float) -> None:
        from .dramatiq_app import ACTOR

        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=self.cfg.queue, actor_name=ACTOR, args=(task_id, seconds), kwargs={},
            options={}, message_id=task_id)
        self.broker.enqueue(message, delay=round(delay_s * 1000) if delay_s > 0 else None)

    def close(self) -> None:
        self.broker.close()


class DramatiqBelayq(DramatiqStack):
    name = "dramatiq-belayq"
    belayq = True
    kind = "belayq"

    def core_stats(self) -> dict[str, Any] | None:
        return dict(self.broker.store(self.cfg.queue).core.stats())  # type: ignore[attr-defined]


class DramatiqBelayqShards(DramatiqBelayq):
    name = "dramatiq-belayq-shards"
    kind = "belayq-shards"


class DramatiqStock(DramatiqStack):
    name = "dramatiq-stock"
    kind = "stock"

    def extra_stats(self) -> dict[str, Any]:
        r = self.admin_client("stats")
        q = f"dramatiq:{self.cfg.queue}"
        try:
            return {"queue_len": r.llen(q), "bodies": r.hlen(f"{q}.msgs"),
                    "delayed": r.hlen(f"{q}.DQ.msgs"), "dead": r.zcard(f"{q}.XQ")}
        finally:
            r.close()
