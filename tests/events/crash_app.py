"""The Celery app of the crash-loop and SCRIPT FLUSH tests (``celery -A tests.events.crash_app
worker``), configured from the environment (``CRASH_*``, set by the tests).

Each task records what it did in Redis lists on the broker's server (db 0), under keys that
start with ``CRASH_TAG`` (unique per test), so a test can count executions across kills:

* ``<tag>:start`` / ``<tag>:done``: ``"<i>:<pid>"`` when a task starts / finishes;
* ``<tag>:poison``: one ``"<i>:<pid>"`` per run of the poison task (before it dies).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq://)
from tests.events.servers import flush_lua

env = os.environ.get


def make_app(
    broker: str | None,
    backend: str | None,
    queue: str,
    *,
    lease_s: float = 3.0,
    max_deliveries: int = 5,
    prefetch: int = 4,
) -> Celery:
    """The app, as the workers build it (the tests build one the same way to send tasks)."""
    app = Celery("crash_app", broker=broker, backend=backend)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=prefetch,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": lease_s,
            "max_deliveries": max_deliveries,
            "sweep_interval": 0.5,
        },
        result_expires=600,
    )
    return app


app = make_app(
    env("CRASH_BROKER"),
    env("CRASH_BACKEND"),
    env("CRASH_QUEUE", "celery"),
    lease_s=float(env("CRASH_LEASE", "3")),
    max_deliveries=int(env("CRASH_MAX_DELIVERIES", "5")),
    prefetch=int(env("CRASH_PREFETCH", "4")),
)
_tag = env("CRASH_TAG", "crash")
_records: redis.Redis | None = None


def records() -> redis.Redis:
    """The client the tasks record with: the broker's server, db 0 (one per process)."""
    global _records
    if _records is None:
        _records = redis.Redis.from_url(
            (env("CRASH_BROKER") or "redis://127.0.0.1:6379/0").replace("belayq://", "redis://")
        )
    return _records


def record(event: str, i: Any) -> None:
    records().rpush(f"{_tag}:{event}", f"{i}:{os.getpid()}")


@app.task(name="crash.work", ignore_result=True)
def work(i: int, seconds: float) -> int:
    record("start", i)
    time.sleep(seconds)
    record("done", i)
    return i


@app.task(name="crash.poison", ignore_result=True)
def poison(i: int) -> None:
    """Kills the process that runs it (a pool child), every time."""
    record("poison", i)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="crash.flush_scripts")
def flush_scripts(i: int) -> str:
    """Empties the server's script cache and function libraries from inside the task (after
    the claim, before the ack), then succeeds."""
    record("start", i)
    flush_lua(records())
    record("done", i)
    return f"flushed-{i}"


@app.task(name="crash.kill_worker", ignore_result=True)
def kill_worker(i: int, seconds: float) -> None:
    """Runs for ``seconds``, then SIGKILLs the whole worker: its main process (the pool's
    parent, which holds the claims) and itself, every time."""
    record("killer", i)
    time.sleep(seconds)
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
