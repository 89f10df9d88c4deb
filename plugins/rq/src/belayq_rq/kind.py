"""belayq's tools on RQ queues (the ``belayq.kinds`` entry point ``rq``): what RQ keeps
beside its queue list, through RQ's own API.

* ``belayq delayed`` (and the dashboard) shows the jobs RQ's scheduler holds back in the
  queue's ``ScheduledJobRegistry`` (``enqueue_in``/``enqueue_at``, and retries with an
  interval), beside belayq's own delayed messages.
* ``belayq purge`` does what ``rq empty`` does: the queued jobs go with their job hashes
  (and their dependents' lists); with ``--delayed``, the scheduled jobs too.
* The dashboard shows RQ's own failures (the queue's ``FailedJobRegistry``), requeues or
  deletes them as ``rq requeue`` and rq-dashboard do, and a job's detail from its hash:
  function, arguments, status, times, and the latest result or exception.
* The numbers every tool shows (:mod:`belayq.readmodel`) count the jobs of the queue's
  ``ScheduledJobRegistry`` as delayed and the unexpired ones of its ``FailedJobRegistry``
  as failed (what RQ's ``registry.count`` answers, without its cleanup), and read the
  oldest waiting job's ``enqueued_at`` (one ``HGET`` of the job at the list's head).

Every read here leaves RQ's registries as they are: RQ's own reads (``get_job_ids``,
``count``) first delete the expired entries, so they are called with ``cleanup=False``, or
the entries RQ's cleanup would delete are skipped instead.
"""

from __future__ import annotations

import time
from typing import Any

from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.registry import FailedJobRegistry, ScheduledJobRegistry
from rq.utils import current_timestamp, str_to_date

from belayq.sharded import AnyQueue

from .queue import enqueued_ms, purge_jobs


class RQTools:
    """The tools' RQ-specific work (see :class:`belayq.kinds.KindTools`)."""

    def purge(self, queue: AnyQueue, *, delayed: bool) -> dict[str, int]:
        client = queue.client
        purged, hashes = purge_jobs(queue, delayed=delayed)
        scheduled = 0
        if delayed:
            registry = ScheduledJobRegistry(queue.name, connection=client)  # type: ignore[no-untyped-call]
            for job_id in registry.get_job_ids(cleanup=False):
                try:
                    registry.remove(job_id, delete_job=True)
                except NoSuchJobError:  # its hash is gone already: the entry alone
                    registry.remove(job_id)
                scheduled += 1
        return {"ready": purged.ready, "delayed": purged.delayed, "scheduled": scheduled,
                "job_keys_deleted": hashes}

    def delayed(self, queue: AnyQueue, limit: int) -> list[dict[str, Any]]:
        registry = ScheduledJobRegistry(queue.name, connection=queue.client)  # type: ignore[no-untyped-call]
        ids = registry.get_job_ids(0, max(0, limit - 1), cleanup=False)
        if not ids:
            return []
        now = time.time()
        jobs = Job.fetch_many(ids, connection=queue.client)
        rows = []
        for job_id, job in zip(ids, jobs, strict=True):
            try:
                due = registry.get_scheduled_time(job_id).timestamp()
            except Exception:  # gone since the listing
                continue
            rows.append({"id": job_id, "due_in_s": round(due - now, 1),
                         "task": job.func_name if job is not None else None,
                         "held_by": "rq scheduler"})
        return rows

    def published_ms(self, queue: AnyQueue, entry: bytes) -> float | None:
        """When RQ enqueued the job ``entry`` names (ms since the epoch), or None."""
        raw = queue.client.hget(Job.key_for(entry.decode("utf-8", "replace")), "enqueued_at")
        if not raw:
            return None
        try:
            return enqueued_ms(str_to_date(raw))
        except ValueError:
            return None

    def framework_counts(self, queue: AnyQueue) -> dict[str, int | None]:
        """What RQ keeps beside the queue's list: ``delayed``, the jobs its scheduler holds
        back (the ``ScheduledJobRegistry``), and ``failed``, the unexpired jobs of its
        ``FailedJobRegistry`` (read only: no cleanup, one pipeline)."""
        pipe = queue.client.pipeline(transaction=False)
        pipe.zcard(_scheduled(queue).key)
        _queue_failed_count(pipe, _failed(queue).key)
        scheduled, total, expired = pipe.execute()
        return {"delayed": int(scheduled), "failed": int(total) - int(expired)}

    def failed_count(self, queue: AnyQueue) -> int:
        """How many unexpired jobs the queue's FailedJobRegistry holds: what RQ's
        ``registry.count`` answers, without the cleanup it does first (read only)."""
        pipe = queue.client.pipeline(transaction=False)
        _queue_failed_count(pipe, _failed(queue).key)
        total, expired = pipe.execute()
        return int(total) - int(expired)

    def failed(self, queue: AnyQueue, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` unexpired failed jobs of the queue's ``FailedJobRegistry``
        (those :meth:`failed_count` counts; read only)."""
        ids = _live_failed_ids(queue, limit) if limit > 0 else []
        jobs = Job.fetch_many(ids, connection=queue.client) if ids else []
        rows: list[dict[str, Any]] = []
        for job_id, job in zip(ids, jobs, strict=True):
            if job is None:
                rows.append({"id": job_id, "task": None, "reason": "(its job hash is gone)"})
                continue
            result = _latest(job)
            rows.append({"id": job_id, "task": _safe(lambda j=job: j.func_name),
                         "failed_at_ms": _ms(job.ended_at),
                         "reason": _last_line(getattr(result, "exc_string", None))})
        return rows

    def retry_failed(self, queue: AnyQueue, ids: list[str]) -> int:
        """Requeue failed jobs as ``rq requeue`` does; ids that are not in the registry (or
        whose job hash is gone) are skipped. Returns how many were requeued."""
        registry = _failed(queue)
        done = 0
        for job_id in dict.fromkeys(ids):
            try:
                registry.requeue(job_id)
            except (InvalidJobOperation, NoSuchJobError):
                continue
            done += 1
        return done

    def delete_failed(self, queue: AnyQueue, ids: list[str]) -> int:
        """Delete failed jobs, hash and registry entry, as rq-dashboard does; ids that are
        not in the registry are skipped. Returns how many were deleted."""
        registry = _failed(queue)
        done = 0
        for job_id in dict.fromkeys(ids):
            if queue.client.zscore(registry.key, job_id) is None:
                continue
            try:
                registry.remove(job_id, delete_job=True)
            except NoSuchJobError:  # its hash is gone already: the entry alone
                registry.remove(job_id)
            done += 1
        return done

    def message(self, queue: AnyQueue, message_id: str) -> dict[str, Any] | None:
        """RQ's record of job ``message_id`` (None when RQ has no such job, or when the job
        belongs to another queue: a job is RQ's record of the queue it was enqueued on, its
        ``origin``, only)."""
        try:
            job = Job.fetch(message_id, connection=queue.client)
        except NoSuchJobError:
            return None
        if job.origin != queue.name:
            return None
        result = _latest(job)
        return {
            "function": _safe(lambda: job.func_name),
            "args": _safe(lambda: repr(job.args)),
            "kwargs": _safe(lambda: repr(job.kwargs)),
            "description": job.description,
            "status": _safe(lambda: _status(job)),
            "origin": job.origin,
            "enqueued_at_ms": _ms(job.enqueued_at),
            "started_at_ms": _ms(job.started_at),
            "ended_at_ms": _ms(job.ended_at),
            "retries_left": job.retries_left,
            "exc_info": getattr(result, "exc_string", None),
            "result": _safe(lambda: repr(result.return_value))
            if result is not None and getattr(result, "return_value", None) is not None
            else None,
        }


def _scheduled(queue: AnyQueue) -> ScheduledJobRegistry:
    return ScheduledJobRegistry(queue.name, connection=queue.client)  # type: ignore[no-untyped-call]


def _failed(queue: AnyQueue) -> FailedJobRegistry:
    return FailedJobRegistry(queue.name, connection=queue.client)


def _queue_failed_count(pipe: Any, key: str) -> None:
    """Queue on ``pipe`` the two replies whose difference is what RQ's ``registry.count``
    answers: every entry, and the expired ones its cleanup would delete first (scores, the
    expiry times, from 0 to now; no expiry is +inf)."""
    pipe.zcard(key)
    pipe.zcount(key, 0, current_timestamp())


def _live_failed_ids(queue: AnyQueue, limit: int) -> list[str]:
    """The ids of the newest ``limit`` failed jobs that RQ's cleanup would keep (an expiry
    after now, or a negative score, which its cleanup never deletes), newest first."""
    key, now, client = _failed(queue).key, current_timestamp(), queue.client
    raw = client.zrevrangebyscore(key, "+inf", f"({now}", start=0, num=limit)
    if len(raw) < limit:
        raw += client.zrevrangebyscore(key, "(0", "-inf", start=0, num=limit - len(raw))
    return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in raw]


def _latest(job: Job) -> Any:
    try:
        return job.latest_result()
    except Exception:  # a result RQ cannot read back: shown as none
        return None


def _safe(read: Any) -> Any:
    """What ``read()`` returns, or a note when the job's data cannot be loaded here (a
    function this process cannot import, a serializer it lacks)."""
    try:
        return read()
    except Exception as exc:
        return f"(cannot be read here: {type(exc).__name__})"


def _status(job: Job) -> str:
    status = job.get_status(refresh=False)
    return str(getattr(status, "value", status))


def _ms(when: Any) -> int | None:
    return int(when.timestamp() * 1000) if when is not None else None


def _last_line(text: str | None) -> str | None:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


TOOLS = RQTools()
