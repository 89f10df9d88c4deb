"""Failed runs, recorded for belayq's tools (:mod:`belayq.failures`).

Dramatiq keeps no record of a run that raised: ``Retries`` enqueues a new message and the
failed one is acked, and only the last run of a message that gives up reaches the
dead-letter set (with its reason). So the worker that ran it records each failed run beside
its queue: the actor, its arguments, the exception, its traceback, the retries so far and
the worker. The dashboard lists, opens and deletes them; ``belayq_framework_failed`` counts
them. One round trip, on failures only.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.errors import Retry
from dramatiq.middleware import Middleware, SkipMessage

from belayq import Delivery, ReliableQueue, ShardedQueue, failures
from belayq.sharded import AnyQueue, parts_of

log = logging.getLogger("belayq_dramatiq")


class FailedRuns(Middleware):
    """Records each run that raised (not ``Retry``, not a skipped message)."""

    def after_process_message(
        self, broker: dramatiq.Broker, message: MessageProxy, *, result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        store = getattr(broker, "store", None)
        if exception is None or store is None or isinstance(exception, (Retry, SkipMessage)):
            return
        fields = {
            "framework": "dramatiq",
            "task": message.actor_name,
            "args": repr(message.args),
            "kwargs": repr(message.kwargs),
            "reason": f"{type(exception).__name__}: {exception}",
            "exc_info": "".join(traceback.format_exception(
                type(exception), exception, exception.__traceback__)),
            "retries": message.options.get("retries", 0),
            "worker": f"{socket.gethostname()}:{os.getpid()}",
            "message_id": message.options.get("redis_message_id"),
        }
        try:
            q = store(message.queue_name).core
            part = _part_of(q, getattr(message, "belayq_delivery", None))
            part.count_failed()
            with q.client.pipeline(transaction=False) as pipe:
                part.flush_observations(pipeline=pipe)
                failures.record(q, message.message_id, int(time.time() * 1000), fields, pipe=pipe)
                pipe.execute()
            failures.trim(q)
        except Exception as exc:  # the tools' record must never fail a message's handling
            log.warning("could not record a failed run of %s (%r)", message.message_id, exc)


def _part_of(q: AnyQueue, delivery: Delivery | None) -> ReliableQueue:
    """The plain queue that counts a run: the claim's shard of a sharded queue."""
    if isinstance(q, ShardedQueue) and isinstance(delivery, Delivery):
        return q.shard_of(delivery)
    return parts_of(q)[0]
