"""RQ jobs, callbacks and worker classes of the crash-loop and SCRIPT FLUSH tests (also
imported by ``rq worker -w tests.events.rq_jobs.<Worker>`` subprocesses).

Each job records its runs in ``runs:<job id>`` (``"<event>:<pid>:<time>"``), each callback in
``callbacks:<job id>``, on the job's own connection, so a test can count what ran where
whatever happened to the processes.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, ClassVar

from rq import get_current_job

import belayq_rq
from tests.events.servers import flush_lua
from tests.plugins.rq.jobs import note_run

LEASE_MS = 3_000
POISON_MAX_DELIVERIES = 3


class CrashQueue(belayq_rq.Queue):
    """Lease 3 s, the default max_deliveries (5): the crash-loop queue."""

    lease_ms = LEASE_MS
    belayq_options: ClassVar[dict[str, Any]] = {"sweep_interval_ms": 500}


class CrashWorker(belayq_rq.Worker):
    """Notes each claim in ``runs:<job id>`` as ``claim:<pid>:<time>``, as soon as it returns:
    a claim counts as a started run, and a kill between the claim and the job's first line
    (the fork of the work horse) loses a run that the job itself never noted."""

    queue_class = CrashQueue

    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        result = super().dequeue_job_and_maintain_ttl(*args, **kwargs)
        if result:
            job = result[0]
            self.connection.rpush(f"runs:{job.id}", f"claim:{os.getpid()}:{time.time():.6f}")
        return result


class CrashSimpleWorker(belayq_rq.SimpleWorker):
    queue_class = CrashQueue


class PoisonQueue(CrashQueue):
    """Lease 3 s, max_deliveries 3: a job that kills its horse fails after 3 runs."""

    max_deliveries = POISON_MAX_DELIVERIES


class PoisonWorker(belayq_rq.Worker):
    queue_class = PoisonQueue


def work(seconds: float) -> float:
    note_run("start")
    time.sleep(seconds)
    note_run("done")
    return seconds


def add(a: int, b: int) -> int:
    note_run("start")
    note_run("done")
    return a + b


def kill_my_horse() -> None:
    """SIGKILL to its own process (the work horse), every time it runs: an OOM kill."""
    note_run("start")
    os.kill(os.getpid(), signal.SIGKILL)


def flush_scripts_then_return(value: str) -> str:
    """Empties the server's script cache and function libraries after the claim and before
    RQ's finishing transaction (which carries belayq's ack), then succeeds."""
    job = get_current_job()
    assert job is not None
    note_run("start")
    flush_lua(job.connection)
    note_run("done")
    return value


def on_success(job: Any, connection: Any, result: Any, *args: Any, **kwargs: Any) -> None:
    connection.rpush(f"callbacks:{job.id}", f"success:{result}")


def on_failure(job: Any, connection: Any, typ: Any, value: Any, tb: Any) -> None:
    connection.rpush(f"callbacks:{job.id}", f"failure:{typ.__name__}:{value}"[:300])
