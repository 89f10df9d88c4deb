"""RQ's abandoned-job cleanup on belayq queues: the started-registry records it must not
fail, because belayq's sweep already put the job back in its queue, or the job ended."""

from __future__ import annotations

import logging
import time
from typing import Any

from rq.exceptions import NoSuchJobError

from . import settle
from .queue import Queue

log = logging.getLogger("belayq_rq")


def _text(entry: Any) -> str:
    return entry.decode() if isinstance(entry, bytes) else str(entry)


def _job_id_of(queue: Queue, entry: str) -> str:
    """The job id of a started-registry entry, whichever form this rq version answers."""
    if ":" not in entry or queue.connection.exists(queue.job_class.key_for(entry)):
        return entry
    return entry.rsplit(":", 1)[0]


def spare_requeued(queue: Queue) -> None:
    """Remove RQ's expired started-registry records of jobs that are not abandoned, so RQ's
    cleanup does not fail them: a job that waits in the queue again (a lost attempt the
    sweep put back), and a job that already ended (FINISHED, FAILED, STOPPED, CANCELED),
    whose record a late execution heartbeat wrote back after the end (seen in the chaos
    run: a connection killed under the worker's heartbeat, re-sent by redis-py after the
    work horse's success)."""
    registry = queue.started_job_registry
    # rq 2.0 answers "job_id:execution_id" entries; later versions answer job ids.
    expired_ids = {_job_id_of(queue, str(x)) for x in registry.get_expired_job_ids()}
    for job_id in expired_ids:
        waiting = queue.get_job_position(job_id) is not None
        try:
            job = queue.job_class.fetch(
                job_id, connection=queue.connection, serializer=queue.serializer
            )
        except NoSuchJobError:
            continue
        ended = job.get_status(refresh=False) in settle.SETTLED
        if not (waiting or ended):
            continue
        with queue.connection.pipeline() as pipe:
            settle.drop_stale_executions(job, pipe)
            # A record written back after the end may name an execution whose own hash is
            # gone: remove the job's expired entries by their parsed job id (RQ's format).
            expired: list[Any] = queue.connection.zrangebyscore(registry.key, 0, time.time())
            stale = [e for e in expired if _job_id_of(queue, _text(e)) == job_id]
            if stale:
                pipe.zrem(registry.key, *stale)
            pipe.execute()
        log.info("job %s: %s; kept out of RQ's abandoned-job cleanup", job_id,
                 "waits for redelivery" if waiting else f"already {job.get_status(refresh=False)}")
