"""A run whose end RQ cannot record because the server went away at that instant (the
primary died; on one server, injected: ``handle_job_success`` raises ``ConnectionError``
before or after RQ's end-of-job transaction committed). Stock RQ then records the job as
FAILED by that error. belayq_rq records nothing and lets the claim decide: if the end was
lost, the job is delivered again after its lease and runs again; if it landed, belayq's ack
went with it and nothing is left to do. Never FAILED, never run twice after a recorded end.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import redis
import rq.worker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

import belayq_rq
from belayq.embedded import RedisServer
from belayq_rq.worker import BelayqWorkerMixin
from tests.conftest import flushed_client
from tests.events import rq_jobs
from tests.support import wait_for


class ShortQueue(belayq_rq.Queue):
    lease_ms = 1000
    belayq_options: ClassVar[dict[str, Any]] = {"sweep_interval_ms": 200}


class _LoseTheEnd(rq.worker.SimpleWorker):
    """RQ's ``handle_job_success`` whose first call raises a lost connection, ``when``
    ("before"/"after") its transaction commits."""

    when = "before"
    lost = False

    def handle_job_success(self, *args: Any, **kwargs: Any) -> None:
        if not self.lost:
            self.lost = True
            if self.when == "after":
                super().handle_job_success(*args, **kwargs)
            raise redis.ConnectionError("Connection reset by peer (the primary died)")
        super().handle_job_success(*args, **kwargs)


class LosingWorker(BelayqWorkerMixin, _LoseTheEnd):
    queue_class = ShortQueue


class ShortWorker(belayq_rq.SimpleWorker):
    queue_class = ShortQueue


def starts(conn: redis.Redis, job_id: str) -> int:
    return sum(1 for x in conn.lrange(f"runs:{job_id}", 0, -1) if x.startswith(b"start"))


@pytest.mark.parametrize("when", ["before", "after"])
def test_end_lost_with_the_server_is_decided_by_the_claim(
    private_redis: RedisServer, qname: str, when: str
) -> None:
    with flushed_client(private_redis) as conn:
        queue = ShortQueue(qname, connection=conn)
        job = queue.enqueue(rq_jobs.add, 1, 2)
        worker = LosingWorker([queue], connection=conn)
        worker.when = when
        worker.work(burst=True)
        assert worker.lost
        failed = FailedJobRegistry(qname, connection=conn)
        assert failed.count == 0, "the job was recorded as FAILED by the lost connection"
        expected = JobStatus.FINISHED if when == "after" else JobStatus.STARTED
        assert Job.fetch(job.id, connection=conn).get_status() == expected
        core = queue.belayq(conn)
        if when == "before":
            # The claim was left to its lease: the sweep puts the job back, and it runs.
            wait_for(lambda: core.sweep().reclaimed or queue.count, 10, "the lease to end")
            ShortWorker([queue], connection=conn).work(burst=True)
        # After: the ack went with RQ's transaction; nothing is left in flight.
        assert Job.fetch(job.id, connection=conn).get_status() == JobStatus.FINISHED
        assert failed.count == 0
        assert starts(conn, job.id) == (1 if when == "after" else 2)
        stats = core.stats()
        assert (int(stats["ready"]), int(stats["in_flight"])) == (0, 0), stats
