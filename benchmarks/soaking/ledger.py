"""The soak's ledger and the task every framework runs, with tracing on in each process.

Every run of a task writes to a redis-server of its own that the soak never counts
(``SOAK_LEDGER_URL``), so the ledger never shows in the broker's keys:

* ``soak:attempts`` hash: task id -> runs started (the attempt number of the next one);
* ``soak:ends`` list: JSON ``[task id, attempt, pid, outcome]`` for each run that ended
  (``ok``, ``failed``, ``retry``, ``rejected``);
* ``soak:spans`` hash: framework -> spans its processes ended (tracing is on in every
  worker: an OpenTelemetry SDK provider whose only processor counts).

A task's plan says how it behaves: ``ok``; ``slow`` (a few seconds, so kills find it held);
``fail`` (raises every run); ``retry:N`` (raises on its first N runs, then succeeds);
``dead`` (a poison message: how it gets to the dead letters is the framework's part).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import redis

LEDGER = "soak:"
_client: redis.Redis | None = None


class PlannedFailure(Exception):
    """The failure a task's plan asks for."""


def _conn() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["SOAK_LEDGER_URL"], socket_timeout=30)
    return _client


def start(task_id: str) -> int:
    """Note a run's start; its attempt number (1 for the first run)."""
    return int(_conn().hincrby(LEDGER + "attempts", task_id, 1))


def end(task_id: str, attempt: int, outcome: str) -> None:
    """Note a run's end with ``outcome``."""
    pipe = _conn().pipeline(transaction=False)
    pipe.rpush(LEDGER + "ends", json.dumps([task_id, attempt, os.getpid(), outcome]))
    pipe.execute()


def behave(plan: str, attempt: int, seconds: float) -> None:
    """Sleep ``seconds``, then raise :class:`PlannedFailure` if the plan says so."""
    time.sleep(seconds)
    if plan == "fail" or plan == "dead":
        raise PlannedFailure(f"planned failure (run {attempt})")
    if plan.startswith("retry:") and attempt <= int(plan.split(":", 1)[1]):
        raise PlannedFailure(f"planned failure before a retry (run {attempt})")


def trace(framework: str) -> Any:
    """Turn tracing on in this process: an SDK tracer provider whose only processor counts
    the spans that end, and belayq's instrumentation. Returns the provider."""
    from opentelemetry import trace as api
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

    from belayq.otel import BelayqInstrumentor

    class Counting(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            with contextlib.suppress(redis.RedisError, KeyError):
                _conn().hincrby(LEDGER + "spans", framework, 1)

    provider = TracerProvider()
    provider.add_span_processor(Counting())
    api.set_tracer_provider(provider)
    BelayqInstrumentor().instrument(tracer_provider=provider)
    return provider
