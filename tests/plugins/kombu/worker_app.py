"""The Celery app the worker tests run (``celery -A worker_app worker``), configured from
the environment the ``workers`` fixture sets. Tasks record start/done events in Redis so
the tests can count executions across workers and kills."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq://)

env = os.environ.get
app = Celery("worker_app", broker=env("BQ_BROKER"), backend=env("BQ_BACKEND"))
app.conf.update(
    task_default_queue=env("BQ_QUEUE", "celery"),
    task_acks_late=env("BQ_ACKS_LATE", "1") == "1",
    task_reject_on_worker_lost=env("BQ_REJECT_ON_LOST", "1") == "1",
    worker_prefetch_multiplier=int(env("BQ_PREFETCH", "4")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(env("BQ_LEASE", "20")),
        "max_deliveries": int(env("BQ_MAX_DELIVERIES", "5")),
        "sweep_interval": float(env("BQ_SWEEP", "0.5")),
        "priority_bell": env("BQ_BELL", "1") == "1",
        "native_delayed_delivery": env("BQ_NATIVE", "1") == "1",
    },
    result_expires=600,
)
# Failover tests: writes wait for a replica; the Sentinel group's name.
for name, value, cast in (("wait_replicas", env("BQ_WAIT_REPLICAS"), int),
                          ("master_name", env("BQ_MASTER_NAME"), str)):
    if value is not None:
        app.conf.broker_transport_options[name] = cast(value)
# Newer worker settings, set only when a test asks (older Celery versions lack them).
for name, value in (
    ("worker_disable_prefetch", env("BQ_DISABLE_PREFETCH")),
    ("worker_eta_task_limit", env("BQ_ETA_LIMIT")),
    ("worker_soft_shutdown_timeout", env("BQ_SOFT_SHUTDOWN")),
    ("worker_enable_prefetch_count_reduction", env("BQ_PREFETCH_REDUCTION")),
):
    if value is not None:
        app.conf[name] = value == "1" if name.startswith(("worker_disable", "worker_enable")) \
            else float(value) if name == "worker_soft_shutdown_timeout" else int(value)
_records = redis.Redis.from_url(env("BQ_BACKEND", "redis://127.0.0.1:6379/1"))

# Tracing tests: spans go to BQ_TRACE_FILE, a JSON line each (every pool child appends).
if env("BQ_TRACE_FILE"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    from belayq.otel import BelayqInstrumentor

    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=open(env("BQ_TRACE_FILE", ""), "a"),  # noqa: SIM115  (the process's life)
        formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(_provider)
    BelayqInstrumentor().instrument(tracer_provider=_provider)
    if env("BQ_TRACE_CELERY") == "1":
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument(tracer_provider=_provider)


def record(event: str, i: Any, request: Any) -> None:
    info = request.delivery_info or {}
    _records.rpush(env("BQ_RECORDS", "records"), json.dumps({
        "ev": event, "i": i, "pid": os.getpid(), "t": time.time(),
        "host": request.hostname, "redelivered": bool(info.get("redelivered")),
    }))


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task
def traced(i: int) -> int:
    """Makes a span of its own (the tracing tests): it must join the publisher's trace."""
    from opentelemetry import trace

    with trace.get_tracer("worker_app").start_as_current_span(f"work {i}"):
        if i < 0:
            raise ValueError(f"task {i} fails")
        return i


@app.task(bind=True)
def sleeper(self: Any, i: int, seconds: float) -> int:
    record("start", i, self.request)
    time.sleep(seconds)
    record("done", i, self.request)
    return i


@app.task(bind=True)
def kill_self(self: Any, i: int) -> None:
    """A poison task: kills the process that runs it (a pool child, or a solo worker)."""
    record("start", i, self.request)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True)
def kill_worker(self: Any, i: int) -> None:
    """Kills the whole worker at once, main process and pool children alike (the worker
    runs in a process group of its own), before any Celery code of it can react."""
    record("start", i, self.request)
    os.killpg(0, signal.SIGKILL)


@app.task(bind=True)
def tsum(self: Any, values: list[int]) -> int:
    record("start", "sum", self.request)
    return sum(values)


@app.task(bind=True, max_retries=3)
def flaky(self: Any, i: int, countdown: float) -> int:
    """Fails its first run and retries with ``countdown``; succeeds the second time."""
    record("start", i, self.request)
    if self.request.retries == 0:
        raise self.retry(countdown=countdown)
    record("done", i, self.request)
    return i


@app.task
def boom(i: int) -> None:
    raise ValueError(f"task {i} always fails")
