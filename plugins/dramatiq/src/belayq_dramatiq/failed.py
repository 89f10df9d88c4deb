"""Failed runs, recorded for belayq's tools (:mod:`belayq.failures`).

Dramatiq keeps no record of a run that raised: ``Retries`` enqueues a new message and the
failed one is acked, and only the last run of a message that gives up reaches the
dead-letter set (with its reason). So the worker that ran it records each failed run beside
its queue: the actor, its arguments, the exception, its traceback, the retries so far and
the worker. The dashboard lists, opens and deletes them; ``belayq_framework_failed`` counts
them. One round trip, on failures only.

A run after which the message is failed for good (``Retries`` gave up, or ``throws``) is no
failed run to retry: the message goes to the dead-letter set, with the reason, and is counted
there once. Its record is not written, and an earlier run's record of the same message is
deleted; the run still counts among the runs that raised (``count_failed``).
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


#: The attribute that carries a failed run's record from the run to its ack.
_PENDING = "_belayq_failed_run"


class FailedRuns(Middleware):
    """Records each run that raised (not ``Retry``, not a skipped message).

    Dramatiq calls the ``after_process_message`` hooks in reverse order, before ``Retries``
    decides; the record is written when the message is settled: at its ack (a retry was
    sent, or nothing retries it), not at its nack (a dead letter).
    """

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
            part = _part_of(store(message.queue_name).core,
                            getattr(message, "belayq_delivery", None))
            part.count_failed()  # written with the record, or the next observations
        except Exception as exc:  # the tools' record must never fail a message's handling
            log.warning("could not count a failed run of %s (%r)", message.message_id, exc)
        setattr(message, _PENDING, (int(time.time() * 1000), fields))

    def before_ack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._settle(broker, message, dead=False)

    def before_nack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._settle(broker, message, dead=True)

    def _settle(self, broker: dramatiq.Broker, message: MessageProxy, *, dead: bool) -> None:
        pending = getattr(message, _PENDING, None)
        store = getattr(broker, "store", None)
        if pending is None or store is None:
            return
        delattr(message, _PENDING)
        failed_at_ms, fields = pending
        try:
            q = store(message.queue_name).core
            part = _part_of(q, getattr(message, "belayq_delivery", None))
            if dead:  # counted as the dead letter it becomes; an earlier run's record goes
                part.flush_observations()
                failures.discard(q, [message.message_id])
                return
            with q.client.pipeline(transaction=False) as pipe:
                part.flush_observations(pipeline=pipe)
                failures.record(q, message.message_id, failed_at_ms, fields, pipe=pipe)
                pipe.execute()
            failures.trim(q)
        except Exception as exc:  # the tools' record must never fail a message's handling
            log.warning("could not record a failed run of %s (%r)", message.message_id, exc)


def _part_of(q: AnyQueue, delivery: Delivery | None) -> ReliableQueue:
    """The plain queue that counts a run: the claim's shard of a sharded queue."""
    if isinstance(q, ShardedQueue) and isinstance(delivery, Delivery):
        return q.shard_of(delivery)
    return parts_of(q)[0]
