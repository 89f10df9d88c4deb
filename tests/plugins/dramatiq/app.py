"""The Dramatiq app the real-worker tests run (``dramatiq tests.plugins.dramatiq.app``).

The environment picks the broker: ``DQ_URL`` (the test's Redis), ``DQ_STOCK=1`` for stock
``RedisBroker`` (``DQ_STOCK_HEARTBEAT_MS``: its ``heartbeat_timeout``, with maintenance on
every command), ``DQ_LEASE_MS``, ``DQ_MAX_DELIVERIES``, ``DQ_STRICT_RUNS`` and
``DQ_SHARDS`` for belayq's;
``DQ_PROMETHEUS=1`` adds Dramatiq's Prometheus middleware (configured by its own
``dramatiq_prom_*`` variables). Every actor records what it did in the test's Redis
(``t:started``, ``t:done``: ``<key> <pid>``).
"""

from __future__ import annotations

import os
import signal
import time

import dramatiq
import redis
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.middleware import Shutdown

from belayq_dramatiq import Broker

URL = os.environ.get("DQ_URL", "redis://127.0.0.1:1/0")
if os.environ.get("DQ_STOCK") == "1":
    heartbeat_ms = os.environ.get("DQ_STOCK_HEARTBEAT_MS")
    maintenance = {} if heartbeat_ms is None else {
        "heartbeat_timeout": int(heartbeat_ms), "maintenance_chance": MAINTENANCE_SCALE}
    broker: dramatiq.Broker = RedisBroker(url=URL, **maintenance)
else:
    broker = Broker(
        url=URL,
        lease_ms=int(os.environ.get("DQ_LEASE_MS", "1000")),
        max_deliveries=int(os.environ.get("DQ_MAX_DELIVERIES", "5")),
        strict_runs=os.environ.get("DQ_STRICT_RUNS") == "1",
        belayq_options={"sweep_interval_ms": 200},
        shards=int(os.environ["DQ_SHARDS"]) if os.environ.get("DQ_SHARDS") else None,
    )
if os.environ.get("DQ_PROMETHEUS") == "1":
    # imported only here: the module reads its environment and makes its directory on import
    from dramatiq.middleware.prometheus import Prometheus

    broker.add_middleware(Prometheus())
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


@dramatiq.actor(notify_shutdown=True, max_retries=3, min_backoff=100, max_backoff=200)
def interruptible(key: str, seconds: float, swallow: bool = False) -> None:
    """Works ``seconds`` on its first run, in short sleeps (Dramatiq's ``Shutdown`` is an
    asynchronous exception: it cannot cut a long sleep short), at once after. On
    ``Shutdown`` it records ``t:shutdown`` and raises it again (Retries retries it), or
    with ``swallow`` returns."""
    if _note("started", key) == 1:
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.05)
        except Shutdown:
            _note("shutdown", key)
            if swallow:
                return
            raise
    _note("done", key)


@dramatiq.actor(max_retries=1, min_backoff=100, max_backoff=200)
def fails(key: str) -> None:
    """Fails every run: one retry, then Dramatiq dead-letters it."""
    _note("failed", key)
    raise RuntimeError(key)
