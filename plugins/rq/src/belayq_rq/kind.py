"""belayq's tools on RQ queues (the ``belayq.kinds`` entry point ``rq``): what RQ keeps
beside its queue list, through RQ's own API.

* ``belayq delayed`` (and the dashboard) shows the jobs RQ's scheduler holds back in the
  queue's ``ScheduledJobRegistry`` (``enqueue_in``/``enqueue_at``, and retries with an
  interval), beside belayq's own delayed messages.
* ``belayq purge`` does what ``rq empty`` does: the queued jobs go with their job hashes
  (and their dependents' lists); with ``--delayed``, the scheduled jobs too.
* The metrics read the oldest waiting job's ``enqueued_at`` (one ``HGET`` of the job at
  the list's head) and the size of the queue's ``FailedJobRegistry`` (one ``ZCARD``).
"""

from __future__ import annotations

import time
from typing import Any

from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.registry import FailedJobRegistry, ScheduledJobRegistry
from rq.utils import str_to_date

from belayq.sharded import AnyQueue

from .queue import enqueued_ms


class RQTools:
    """The tools' RQ-specific work (see :class:`belayq.kinds.KindTools`)."""

    def purge(self, queue: AnyQueue, *, delayed: bool) -> dict[str, int]:
        client = queue.client
        hashes = 0

        def delete_jobs(job_ids: list[bytes]) -> None:
            nonlocal hashes
            keys = [key for raw in job_ids for job_id in [raw.decode("utf-8", "replace")]
                    for key in (Job.key_for(job_id), Job.dependents_key_for(job_id))]
            if keys:
                hashes += int(client.delete(*keys))

        purged = queue.purge(delayed=delayed, on_entries=delete_jobs)
        scheduled = 0
        if delayed:
            registry = ScheduledJobRegistry(queue.name, connection=client)  # type: ignore[no-untyped-call]
            for job_id in registry.get_job_ids():
                try:
                    registry.remove(job_id, delete_job=True)
                except NoSuchJobError:  # its hash is gone already: the entry alone
                    registry.remove(job_id)
                scheduled += 1
        return {"ready": purged.ready, "delayed": purged.delayed, "scheduled": scheduled,
                "job_keys_deleted": hashes}

    def delayed(self, queue: AnyQueue, limit: int) -> list[dict[str, Any]]:
        registry = ScheduledJobRegistry(queue.name, connection=queue.client)  # type: ignore[no-untyped-call]
        ids = registry.get_job_ids(0, max(0, limit - 1))
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

    def failed_jobs(self, queue: AnyQueue) -> int:
        """How many jobs the queue's FailedJobRegistry holds (read only: no cleanup)."""
        registry = FailedJobRegistry(queue.name, connection=queue.client)
        return int(queue.client.zcard(registry.key))


TOOLS = RQTools()
