"""A belayq_rq worker started while the primary is away (a replacement started during a
failover, before the sentinels name the new primary) waits for it instead of exiting: RQ's
records of its start (its client name, its birth, its command channel) are tried again
until the sentinels name the new primary, and then it works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

from belayq.embedded import RedisSentinelServers

from . import rq_app
from .harness import master_client, replicas_caught_up

pytestmark = pytest.mark.timeout(60)

JOBS = 3
JOB_S = 0.05


def test_a_worker_started_while_the_primary_is_away_waits_for_the_new_one(
    start_sentinels: Callable[..., RedisSentinelServers], tmp_path: Path, qname: str
) -> None:
    group = start_sentinels(down_after_ms=1000)
    path = tmp_path / "runs.log"
    client = master_client(group)
    worker_client = master_client(group)
    try:
        queue = rq_app.SentinelQueue(qname, connection=client)
        ids = [str(queue.enqueue(rq_app.work, JOB_S, str(path)).id) for _ in range(JOBS)]
        replicas_caught_up(group)
        group.kill_primary()
        killed = time.monotonic()
        # The sentinels still name the dead primary for down-after ms, then none, then the
        # promoted replica: the worker's first writes (in its constructor) find no server.
        worker = rq_app.SentinelSimpleWorker(
            [rq_app.SentinelQueue(qname, connection=worker_client)], connection=worker_client
        )
        waited_s = time.monotonic() - killed
        assert waited_s > 0.5, f"the worker started {waited_s:.2f} s after the kill: no wait"
        assert worker.work(burst=True)
        with master_client(group) as survivor:
            jobs = Job.fetch_many(ids, connection=survivor)
            assert [j.get_status(refresh=False) if j else None for j in jobs] == [
                JobStatus.FINISHED
            ] * JOBS
            assert FailedJobRegistry(qname, connection=survivor).count == 0
    finally:
        client.close()
        worker_client.close()
    print(f"\n[rq worker started during a failover] waited {waited_s:.2f} s, then ran {JOBS} jobs")
