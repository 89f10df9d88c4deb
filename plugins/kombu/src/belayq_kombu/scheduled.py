"""``celery inspect scheduled`` on belayq://: the ETA and countdown tasks that wait in Redis.

Celery's ``scheduled`` command lists what each worker holds in its timer for an ETA. With
native delayed delivery those tasks wait in the queue's delayed set instead, in no worker's
memory, so the stock command would list none of them. A worker on belayq:// therefore adds,
to what its timer holds, the delayed tasks of each queue it consumes *and leads* (see
:mod:`belayq.leading`: one worker at a time leads a queue, so each task is listed once in a
broadcast, not once per worker). Each entry has the shape Celery's own gives (``eta``,
``priority``, and ``request`` from Celery's ``Request.info()``), built by Celery's own
``Request`` from the stored message, as the worker would build it when the task is due.

A queue is led only while a task waits in its delayed set: an idle worker writes nothing.
The leads are renewed by each worker's sweep (:func:`lead`), taken by the sweep or by the
first worker a ``scheduled`` request reaches once a task waits (so a task delayed since the
last sweep is listed at once, still by one worker), and given up when the channel closes
(:func:`resign`).

The cost is bounded: a reply reads at most ``scheduled_max`` delayed tasks (a transport
option, 1,000 by default), two reads per led queue. Only the delayed set is read; nothing is
written but the lead of a queue whose delayed set holds a task and that nobody leads.
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import datetime, timezone
from time import monotonic
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from belayq.discovery import hidden

from . import celery_state

if TYPE_CHECKING:
    from .channel import Channel

log = logging.getLogger("belayq.kombu")

#: The priority Celery gives an ETA task's timer entry (its task strategy's), which its
#: ``scheduled`` reply shows.
ETA_TIMER_PRIORITY = 6

#: Stands in for a task this worker does not know: Celery's ``Request`` reads only its
#: ``ignore_result`` when it is built, and ``info()`` none of it.
_UNKNOWN_TASK = SimpleNamespace(ignore_result=False)


def lead(channel: Channel) -> None:
    """Take or renew this process's lead of each task queue ``channel`` consumes whose
    delayed set holds a task, for a lease, every third of one
    (:meth:`belayq.ReliableQueue.lead`: nothing is written for a queue where nothing waits,
    and its lead lapses). A lead that cannot be
    renewed (Redis unreachable, a full server) lapses; the sweep goes on."""
    now = monotonic()
    for name in channel.active_queues:
        if hidden("kombu", name) or now < channel.lead_due.get(name, 0.0):
            continue
        rq = channel.queue(name)
        channel.lead_due[name] = now + rq.config.heartbeat_ms / 1000
        try:
            rq.lead()
        except Exception as exc:
            log.debug("the lead of %s was not renewed: %r", name, exc)


def resign(channel: Channel) -> None:
    """Give up the leads ``channel`` renewed, so that another worker lists their delayed
    tasks from its next renewal on, not once the leads expire; never raises."""
    for name in list(channel.lead_due):
        channel.lead_due.pop(name, None)
        try:
            channel.queue(name).resign()
        except Exception as exc:
            log.debug("the lead of %s was not given up (it lapses): %r", name, exc)


def install() -> bool:
    """Make this process's Celery worker list the delayed tasks it leads in its ``scheduled``
    replies (idempotent); False when Celery's worker is not installed."""
    control = celery_state.control_panel()
    if control is None:
        return False
    if getattr(control.Panel.data.get("scheduled"), "_belayq", False):
        return True
    stock = control.scheduled

    @functools.wraps(stock)
    def scheduled(state: Any, **kwargs: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = stock(state, **kwargs)
        held = {row.get("request", {}).get("id") for row in rows}
        return rows + [row for row in waiting_in_redis(state.consumer)
                       if row["request"]["id"] not in held]

    scheduled._belayq = True  # type: ignore[attr-defined]
    control.inspect_command(alias="dump_schedule")(scheduled)
    return True


def waiting_in_redis(consumer: Any) -> list[dict[str, Any]]:
    """The ``scheduled`` entries of the delayed tasks of the queues ``consumer`` (a Celery
    worker's consumer) takes from a belayq:// channel and that this process leads, soonest
    due first (a queue nobody leads and where a task waits is led from now on by this
    process); [] on another transport. Redis unreachable: [] and a warning (the reply
    still lists what the worker holds)."""
    task_consumer: Any = getattr(consumer, "task_consumer", None)
    channel: Any = getattr(task_consumer, "channel", None)
    if getattr(channel, "scheduled_max", None) is None:  # not a belayq:// channel
        return []
    left = int(channel.scheduled_max)
    out: list[dict[str, Any]] = []
    try:
        for queue in task_consumer.queues:
            rq = channel.queue(queue.name)
            if left <= 0 or not (rq.leads() or rq.lead()):
                continue
            found = rq.delayed_messages(left)
            left -= len(found)
            out += [row for m in found
                    if (row := entry(consumer, channel, m.payload, m.due_ms)) is not None]
    except Exception as exc:
        log.warning("inspect scheduled: the delayed tasks in Redis could not be read (%r); "
                    "this reply lists only the tasks this worker holds", exc)
        return []
    return out


def entry(consumer: Any, channel: Any, payload: bytes | None, due_ms: int) -> dict[str, Any] | None:
    """One ``scheduled`` entry for a stored kombu message, as Celery's worker gives it for an
    ETA task in its timer; None for a message that is no Celery task (protocol 2) or does not
    decode as the worker accepts it."""
    Request = celery_state.request_class()
    try:
        raw = json.loads(payload or b"")
        headers = raw.get("headers")
        if not isinstance(headers, dict) or not isinstance(headers.get("task"), str):
            return None
        raw["properties"] = {**raw["properties"], "delivery_tag": None}
        message = channel.Message(raw, channel=channel,
                                  accept=getattr(consumer.task_consumer, "accept", None))
        app = consumer.app
        request = Request(message, app=app, hostname=consumer.hostname,
                          task=app.tasks.get(headers["task"], _UNKNOWN_TASK),
                          connection_errors=consumer.connection.connection_errors)
    except Exception as exc:
        log.debug("inspect scheduled: a delayed message is left out: %r", exc)
        return None
    eta = request.eta or datetime.fromtimestamp(due_ms / 1000, timezone.utc)
    return {"eta": eta.isoformat(), "priority": ETA_TIMER_PRIORITY, "request": request.info()}
