"""What RQ's own records must say when belayq redelivers a job or gives up on it.

RQ keeps, per attempt, an Execution (a hash, a member of the job's execution registry and
a member of the queue's StartedJobRegistry). An attempt that was lost (its worker or work
horse died) leaves them behind; if they stayed, RQ's StartedJobRegistry cleanup would later
fail a job that belayq already ran again. These helpers put RQ's records right, always
through RQ's own API.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from typing import TYPE_CHECKING, Any

from rq.exceptions import AbandonedJobError
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.queue import Queue as RQQueue

from belayq import ConnectionLost

from .claims import Claim

if TYPE_CHECKING:
    from redis.client import Pipeline
    from rq.timeouts import BaseDeathPenalty

log = logging.getLogger("belayq_rq")

#: Statuses that mean someone already settled the job: a redelivered copy must not run.
SETTLED = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED})


def drop_stale_executions(job: Job, pipeline: Pipeline) -> int:
    """Queue the removal of every Execution of ``job`` (its lost attempts) on ``pipeline``.

    Call it only while no attempt of the job runs (belayq hands the job to one consumer
    at a time). Returns how many were found.
    """
    ids = ExecutionRegistry(job_id=job.id, connection=job.connection).get_execution_ids()
    for execution_id in ids:
        execution = Execution(execution_id, job.id, connection=job.connection)
        execution.delete(job=job, pipeline=pipeline)
    return len(ids)


def ack_ended(job: Job, claim: Claim) -> None:
    """Ack the redelivery of a job that had in fact ended (its lost attempt finished, or
    RQ's cleanup failed it first). Attempts lost since then left StartedJobRegistry
    entries, which RQ's cleanup would turn into a FAILED AbandonedJobError: they go too, in
    the same transaction."""
    with claim.core.client.pipeline() as pipe:
        drop_stale_executions(job, pipe)
        claim.core.ack_on(pipe, [claim.delivery])
        pipe.execute()


def forget_lost_attempts(job: Job) -> None:
    """Remove RQ's records of a job's lost attempts before it runs again."""
    with job.connection.pipeline() as pipe:
        if drop_stale_executions(job, pipe):
            pipe.execute()


def _cleanup_execution(worker: Any, job: Job, pipeline: Pipeline) -> None:
    """RQ's own cleanup of the worker's current execution, without belayq's ack (the
    callers settle the claim themselves)."""
    from rq.worker import BaseWorker

    BaseWorker.cleanup_execution(worker, job, pipeline)


def lost_reason(claim: Claim, cause: str) -> str:
    """The reason RQ shows for a job that ran out of deliveries."""
    most = claim.core.config.max_deliveries
    return (
        f"belayq: lost {most} of {most} deliveries (max_deliveries={most}): each time, the "
        f"worker or work horse running the job died before it finished (last: {cause}). "
        "Moved to FailedJobRegistry without using the job's Retry budget."
    )


def fail_for_good(
    job: Job,
    queue: RQQueue,
    claim: Claim,
    reason: str,
    *,
    worker: Any = None,
    death_penalty_class: type[BaseDeathPenalty] | None = None,
) -> None:
    """Move a job that ran out of deliveries to FailedJobRegistry, acking its claim in the
    same transaction; then run its on_failure callback (with AbandonedJobError, as RQ does
    for an abandoned job) and enqueue the dependents that allow failure.

    Args:
        job: The job.
        queue: The RQ queue it was claimed from.
        claim: Its claim.
        reason: The exc_string RQ stores in the failed registry and the Result.
        worker: The worker whose current execution this was (None: none running).
        death_penalty_class: Bounds the callback's run time.
    """
    log.error("job %s failed for good: %s", job.id, reason)
    with job.connection.pipeline() as pipe:
        job.set_status(JobStatus.FAILED, pipeline=pipe)
        drop_stale_executions(job, pipe)
        if worker is not None:
            _cleanup_execution(worker, job, pipe)
        if "worker_name" in inspect.signature(job._handle_failure).parameters:  # rq >= 2.1
            job._handle_failure(reason, pipeline=pipe, worker_name=getattr(worker, "name", ""))
        else:
            job._handle_failure(reason, pipeline=pipe)
        claim.core.ack_on(pipe, [claim.delivery])
        pipe.execute()
    if death_penalty_class is not None:
        try:
            exc = AbandonedJobError(reason)
            job.execute_failure_callback(
                death_penalty_class, AbandonedJobError, exc, traceback.extract_stack()
            )
        except Exception:
            log.exception("job %s: on_failure callback raised", job.id)
    send_webhooks = getattr(job, "send_webhooks", None)  # rq >= 2.10
    if send_webhooks is not None:
        send_webhooks(JobStatus.FAILED, exc_string=reason)
    queue.enqueue_dependents(job)


def requeue_lost(job: Job, claim: Claim, worker: Any, cause: str) -> str:
    """Hand a job whose attempt was lost back to the front of its queue (a counted delivery).

    RQ's records go first (status queued, this attempt's execution removed), then the claim
    goes back: a crash in between leaves the claim to expire and be swept back anyway.

    Returns:
        The core's outcome: ``"ready"``, ``"stale"`` when the lease was already lost, or
        ``"retrying"`` when Redis could not be reached: the core's lease keeper hands the
        claim back once it can (``retry_later``), and the worker goes on meanwhile.
    """
    with job.connection.pipeline() as pipe:
        job.set_status(JobStatus.QUEUED, pipeline=pipe)
        _cleanup_execution(worker, job, pipe)
        pipe.execute()
    try:
        outcome = claim.core.nack(claim.delivery, delay_ms=0, reason=cause)
    except ConnectionLost:
        claim.core.retry_later("nack", [claim.delivery], cause)
        outcome = "retrying"
    log.warning(
        "job %s: attempt lost (%s); redelivering (delivery %d of max %d): %s",
        job.id,
        cause.strip(),
        claim.delivery.attempts,
        claim.core.config.max_deliveries,
        outcome,
    )
    return outcome
