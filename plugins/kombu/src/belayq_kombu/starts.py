"""A Celery task's start, reported to the core before the task body runs.

A run counts toward ``max_deliveries`` (and then the dead-letter set) once the core hears
that it started; what a worker only prefetched never counts. The report must reach Redis
before the task can do anything, or a task that kills its whole worker at once (main
process and pool children) is never counted and comes back without limit. So the process
that runs a task reports it, on Celery's ``task_prerun`` signal, before the body runs. The
report is written to the connection and its answer read later (at the next report, or the
lease keeper's beat): once written, the kernel delivers it even if the process is killed
the next instant, so waiting for the answer would only cost a round trip per task.

* solo and threads pools: the worker's own process, which holds the claim
  (:meth:`.tags.Tags.start_now`);
* prefork: the pool child, over a connection of its own opened on its first task, with the
  claim the message carries (:data:`CLAIM_PROPERTY`, set when the channel delivers it).

When the report cannot reach Redis, the task still runs; the worker's main process reports
the start on its next tick (:meth:`.tags.Tags.report_starts`), as the only report before.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from belayq import Delivery, failures
from belayq.sent import Answer
from belayq.sharded import parts_of

from . import celery_state
from .kept import ALL_TAGS

log = logging.getLogger("belayq.kombu")

#: After a report that could not reach Redis, a pool child leaves the reports to the worker's
#: main process for this long (s), instead of delaying each task by a connection timeout.
QUIET_AFTER_FAILURE_S = 5.0

#: Message property naming the claim a delivery stands for: ``[queue, message id, token]``.
CLAIM_PROPERTY = "x-belayq-claim"


def stamp(props: dict[str, Any], queue: str, delivery: Delivery | None) -> None:
    """Mark a delivered message's properties with its claim (None: no claim to report, an
    auto-acked delivery); a mark a producer copied from another message is replaced."""
    if delivery is None:
        props.pop(CLAIM_PROPERTY, None)
    else:
        props[CLAIM_PROPERTY] = [queue, delivery.id, delivery.token]


class PoolChild:
    """A pool child's reporter: one kombu connection of the child's own, opened with the
    app's broker settings on its first task (a child never consumes, so it has none)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._connection: Any = None
        self._chan: Any = None
        self._quiet_until = 0.0
        #: The last report sent: its queue, and the function that reads its answer.
        self._pending: tuple[str, Answer[list[bool]]] | None = None

    def report(self, app: Any, claim: Any) -> None:
        """Report the start of ``claim`` (a :data:`CLAIM_PROPERTY` value): sent before this
        returns, its answer read at the next report (the child never waits for Redis)."""
        try:
            queue, msg_id, token = (str(part) for part in claim)
        except (TypeError, ValueError):
            return  # not a claim this transport stamped
        with self._lock:
            if time.monotonic() < self._quiet_until:
                return  # Redis was just unreachable: do not delay each task by a timeout
            try:
                self._answer()
                self._pending = (
                    queue, self._channel(app).queue(queue).send_started([(msg_id, token)])
                )
            except Exception as exc:  # the task must run anyway: it is counted later
                log.warning("could not report the start of a task from %s (%r); the worker "
                            "reports it on its next tick", queue, exc)
                self._close()
                self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE_S

    def report_failed(self, app: Any, claim: Any, task_id: str | None,
                      fields: dict[str, Any]) -> None:
        """Count the failed run of ``claim`` (a :data:`CLAIM_PROPERTY` value) in its
        queue's ``failed`` counter, and record it (``fields``: the task, its arguments, the
        exception and its traceback) for the tools (:mod:`belayq.failures`): Celery acks a
        failed task like a successful one, so the transport alone cannot tell them apart.
        One round trip, on failures only; a failure that cannot be written is logged and
        not counted."""
        try:
            queue, msg_id = str(claim[0]), str(claim[1])
        except (TypeError, IndexError):
            return
        with self._lock:
            try:
                q = self._channel(app).queue(queue)
                q.count_failed()
                with parts_of(q)[0].client.pipeline(transaction=False) as pipe:
                    q.flush_observations(pipeline=pipe)
                    if task_id:
                        failures.record(q, task_id, int(time.time() * 1000),
                                        {**fields, "message_id": msg_id}, pipe=pipe)
                    pipe.execute()
                if task_id:
                    failures.trim(q)
            except Exception as exc:  # the metrics must never fail a task's handling
                log.warning("could not count a failed task of %s (%r)", queue, exc)
                self._close()

    def _answer(self) -> None:
        """Read the answer of the last report sent."""
        pending, self._pending = self._pending, None
        if pending is None or self._pid != os.getpid():
            return
        queue, read = pending
        [ok] = read()
        if not ok:
            log.warning("a task of %s started on a claim that is no longer valid (its lease "
                        "expired): the message may run twice", queue)

    def _channel(self, app: Any) -> Any:
        if self._pid != os.getpid():
            self._connection = self._chan = None  # inherited from the parent: not ours
            self._pid = os.getpid()
        if self._chan is None:
            self._connection = app.connection_for_read()
            # One attempt (kombu's default_channel would retry for seconds): a failure is
            # left to the worker's main process, see report().
            self._chan = self._connection.channel()
        return self._chan

    def _close(self) -> None:
        self._chan = None
        self._pending = None
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.release()
            except Exception:
                log.debug("closing the start-report connection", exc_info=True)


POOL_CHILD = PoolChild()


def _on_task_prerun(task: Any = None, **_: Any) -> None:
    props = getattr(getattr(task, "request", None), "properties", None)
    if not isinstance(props, dict):
        return
    tag = props.get("delivery_tag")
    if tag is None:
        return
    for tags in list(ALL_TAGS):
        if tags.start_now(tag):
            return
    claim = props.get(CLAIM_PROPERTY)
    if claim is not None:
        POOL_CHILD.report(task.app, claim)


def _on_task_failure(sender: Any = None, task_id: str | None = None, exception: Any = None,
                     einfo: Any = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    props = getattr(request, "properties", None)
    claim = props.get(CLAIM_PROPERTY) if isinstance(props, dict) else None
    if claim is not None:
        POOL_CHILD.report_failed(sender.app, claim, task_id, failure_fields(
            sender, request, exception, einfo))


def failure_fields(task: Any, request: Any, exception: Any, einfo: Any) -> dict[str, Any]:
    """What the record of a failed run keeps (:mod:`belayq.failures`): the task's name,
    its arguments as Celery shows them (``argsrepr``, ``kwargsrepr``), the exception, its
    traceback, the retries so far, and the worker that ran it."""
    def shown(name: str, value: Any) -> str | None:
        text = getattr(request, name, None)
        return text if isinstance(text, str) else (repr(value) if value is not None else None)

    return {
        "framework": "celery",
        "task": getattr(task, "name", None),
        "args": shown("argsrepr", getattr(request, "args", None)),
        "kwargs": shown("kwargsrepr", getattr(request, "kwargs", None)),
        "reason": f"{type(exception).__name__}: {exception}" if exception is not None else None,
        "exc_info": str(getattr(einfo, "traceback", "") or "") or None,
        "retries": getattr(request, "retries", None),
        "root_id": getattr(request, "root_id", None),
        "parent_id": getattr(request, "parent_id", None),
        "worker": f"{getattr(request, 'hostname', None) or socket.gethostname()} "
                  f"pid {os.getpid()}",
    }


def connect_signals() -> None:
    """Report task starts and failures from the process that runs them (Celery's
    ``task_prerun`` and ``task_failure``)."""
    celery_state.on_task_prerun(_on_task_prerun)
    celery_state.on_task_failure(_on_task_failure)
