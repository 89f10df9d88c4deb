"""RQ classes and jobs of the Sentinel failover test (imported by its ``rq worker``
subprocesses too).

A job notes its start and end in a local file (``<event> <job id> <pid> <monotonic s>``),
not in Redis, so the notes survive the writes a failover loses. ``time.monotonic()`` is
the system-wide clock on Linux, comparable between the worker processes and the test.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from rq import get_current_job

import belayq_rq

LEASE_MS = 3_000


class SentinelQueue(belayq_rq.Queue):
    """Lease 3 s; every settle belayq sends waits for one replica."""

    lease_ms = LEASE_MS
    belayq_options: ClassVar[dict[str, Any]] = {
        "sweep_interval_ms": 500,
        "wait_replicas": 1,
        "wait_timeout_ms": 1000,
    }


class SentinelWorker(belayq_rq.Worker):
    queue_class = SentinelQueue


def note(path: str, event: str) -> None:
    job = get_current_job()
    assert job is not None
    line = f"{event} {job.id} {os.getpid()} {time.monotonic():.6f}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def work(seconds: float, path: str) -> float:
    note(path, "start")
    time.sleep(seconds)
    note(path, "done")
    return seconds


class SentinelSimpleWorker(belayq_rq.SimpleWorker):
    queue_class = SentinelQueue
