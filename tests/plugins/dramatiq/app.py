"""The Dramatiq app the real-worker tests run (``dramatiq tests.plugins.dramatiq.app``).

The environment picks the broker: ``DQ_URL`` (the test's Redis), ``DQ_STOCK=1`` for stock
``RedisBroker``, ``DQ_LEASE_MS``, ``DQ_MAX_DELIVERIES`` and ``DQ_SHARDS`` for belayq's. Every actor
records what it did in the test's Redis (``t:started``, ``t:done``: ``<key> <pid>``).
"""

from __future__ import annotations

import os
import signal
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from belayq_dramatiq import Broker

URL = os.environ.get("DQ_URL", "redis://127.0.0.1:1/0")
if os.environ.get("DQ_STOCK") == "1":
    broker: dramatiq.Broker = RedisBroker(url=URL)
else:
    broker = Broker(
        url=URL,
        lease_ms=int(os.environ.get("DQ_LEASE_MS", "1000")),
        max_deliveries=int(os.environ.get("DQ_MAX_DELIVERIES", "5")),
        belayq_options={"sweep_interval_ms": 200},
        shards=int(os.environ["DQ_SHARDS"]) if os.environ.get("DQ_SHARDS") else None,
    )
dramatiq.set_broker(broker)
record = redis.Redis.from_url(URL)


def _note(what: str, key: str) -> int:
    """Record ``key`` under ``t:<what>``; returns how many times this key was started."""
    record.rpush(f"t:{what}", f"{key} {os.getpid()}")
    return int(record.hincrby(f"t:runs:{what}", key, 1))


@dramatiq.actor(max_retries=0)
def mark(key: str) -> None:
    _note("done", key)


@dramatiq.actor(max_retries=0)
def slow(key: str, seconds: float, later_seconds: float | None = None) -> None:
    """Sleeps ``seconds`` on its first run, ``later_seconds`` (default: the same) after."""
    run = _note("started", key)
    time.sleep(seconds if run == 1 or later_seconds is None else later_seconds)
    _note("done", key)


@dramatiq.actor(max_retries=0)
def poison(key: str) -> None:
    """Kills the worker process that runs it, every time."""
    _note("started", key)
    os.kill(os.getpid(), signal.SIGKILL)
