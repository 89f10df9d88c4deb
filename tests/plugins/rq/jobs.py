"""Jobs and worker classes that the RQ tests run, also in ``rq worker`` subprocesses.

Each job records its runs in a Redis list ``runs:<job id>`` (pid and time), so a test sees
how often and where a job ran, whatever happened to the processes.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, ClassVar

from rq import get_current_job

import belayq_rq

SHORT_LEASE_MS = 2_000
MAX_DELIVERIES = 3


class FastQueue(belayq_rq.Queue):
    """A queue with a short lease, so crash tests take seconds."""

    lease_ms = SHORT_LEASE_MS
    max_deliveries = MAX_DELIVERIES
    belayq_options: ClassVar[dict[str, Any]] = {"sweep_interval_ms": 200}


class FastWorker(belayq_rq.Worker):
    queue_class = FastQueue


class FastSimpleWorker(belayq_rq.SimpleWorker):
    queue_class = FastQueue


def note_run(event: str) -> None:
    """Note an event of the current job in ``runs:<job id>`` as ``<event>:<pid>:<time>``."""
    job = get_current_job()
    assert job is not None
    job.connection.rpush(f"runs:{job.id}", f"{event}:{os.getpid()}:{time.time():.6f}")


def add(a: int, b: int) -> int:
    return a + b


def noop() -> None:
    return None


def record(tag: str = "") -> str:
    note_run("start")
    note_run("done")
    return tag


def sleeper(seconds: float) -> float:
    note_run("start")
    time.sleep(seconds)
    note_run("done")
    return seconds


def hold_gil(seconds: float) -> float:
    """C calls that keep the GIL for at least ``seconds`` (sum over a range never lets
    another thread of this process run)."""
    note_run("start")
    t0 = time.perf_counter()
    sum(range(2_000_000))
    per_item = (time.perf_counter() - t0) / 2_000_000
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:  # calibrated under load, it may run faster
        sum(range(max(1, int((seconds - (time.perf_counter() - t0)) / per_item))))
    held = time.perf_counter() - t0
    note_run("done")
    return held


def fail() -> None:
    note_run("start")
    raise ValueError("this job always fails")


def kill_my_horse() -> None:
    """Dies like an OOM kill: SIGKILL to its own process, every time it runs."""
    note_run("start")
    os.kill(os.getpid(), signal.SIGKILL)


def kill_horse_once() -> str:
    """SIGKILLs itself on its first delivery only; finishes on the next one."""
    job = get_current_job()
    assert job is not None
    first = job.connection.llen(f"runs:{job.id}") == 0
    note_run("start")
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
    note_run("done")
    return "survived"


def append_to(key: str, value: str) -> None:
    job = get_current_job()
    assert job is not None
    job.connection.rpush(key, value)


def on_success_cb(job: Any, connection: Any, result: Any, *args: Any, **kwargs: Any) -> None:
    connection.rpush(f"callbacks:{job.id}", f"success:{result}")


def on_failure_cb(job: Any, connection: Any, typ: Any, value: Any, tb: Any) -> None:
    connection.rpush(f"callbacks:{job.id}", f"failure:{typ.__name__}")


#: pids of the processes that read redis-py's version from its package metadata (the test
#: that fills it patches ``redis.utils.get_lib_version``).
LIB_VERSION_LOOKUPS: list[int] = []


def lib_version_lookups_here() -> int:
    """How often the process running this job (a work horse) read redis-py's version."""
    return LIB_VERSION_LOOKUPS.count(os.getpid())


#: The tracer provider the tracing tests give :func:`traced`'s own span.
TRACER_PROVIDER: Any = None


def traced(i: int) -> int:
    """Makes a span of its own (the tracing tests): it must join the enqueuer's trace."""
    from opentelemetry import trace

    tracer = trace.get_tracer("jobs", tracer_provider=TRACER_PROVIDER)
    with tracer.start_as_current_span(f"work {i}"):
        if i < 0:
            raise ValueError(f"job {i} fails")
        return i
