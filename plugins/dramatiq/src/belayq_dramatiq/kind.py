"""belayq's tools on Dramatiq queues (the ``belayq.kinds`` entry point ``dramatiq``): the
message bodies (the core's payloads: ``<list>.msgs`` in stock's layout), and the failed
runs its workers record (:mod:`belayq_dramatiq.failed`).

* The dashboard's message detail shows the message as Dramatiq sent it: the actor, its
  arguments, options and when it was sent, and its last failed run when one is recorded.
* The dashboard lists, opens and deletes the failed runs. It does not requeue them: a
  Dramatiq message is retried by its actor's ``Retries`` policy, which knows what may run
  twice; a message that gave up is in the dead-letter set, which the tools replay.
* Search finds a message by its Dramatiq ``message_id``, read from its body.
* The metrics read the oldest waiting message's send time (one ``HGET`` of its body), and
  count the failed runs.
"""

from __future__ import annotations

import json
from typing import Any

from belayq import failures
from belayq.failures import RecordedFailures
from belayq.sharded import AnyQueue, parts_of


def _body(queue: AnyQueue, message_id: str | bytes) -> dict[str, Any] | None:
    """The body of message ``message_id``: its payload (in stock's layout, its entry in the
    list's ``.msgs`` hash)."""
    raw = next((found for part in parts_of(queue)
                if (found := part.client.hget(part.keys.payloads, message_id)) is not None),
               None)
    if raw is None:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class DramatiqTools(RecordedFailures):
    """The tools' Dramatiq-specific work (see :class:`belayq.kinds.KindTools`); its failed
    runs are those its workers record (:class:`belayq.failures.RecordedFailures`)."""

    #: A message's last failed run (``Retries`` gave up) is dead-lettered, not acked: the
    #: history's completed runs are the acked ones less the failed runs that were acked.
    failed_runs_dead_lettered = True

    def message(self, queue: AnyQueue, message_id: str) -> dict[str, Any] | None:
        """Message ``message_id`` (its id in the queue's list) as Dramatiq sent it, or the
        last failed run of Dramatiq message ``message_id``; None when neither is kept."""
        body = _body(queue, message_id)
        if body is None:  # gone from the queue: its last failed run, as the other kinds'
            return super().message(queue, message_id)
        out: dict[str, Any] = {}
        if body is not None:
            out = {key: body.get(key) for key in ("actor_name", "queue_name", "args", "kwargs",
                                                  "options", "message_id", "message_timestamp")}
        failed = failures.get(queue, str(out.get("message_id") or message_id))
        if failed is not None:
            out["last_failure"] = failed
        return out or None

    def ids_of(self, payload: bytes) -> list[str]:
        """The ``message_id`` of a message's body (its list entry is another id, the
        ``redis_message_id``, as stock's), by which search finds it."""
        try:
            body = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return []
        found = body.get("message_id") if isinstance(body, dict) else None
        return [found] if isinstance(found, str) and found else []

    def published_ms(self, queue: AnyQueue, entry: bytes) -> float | None:
        body = _body(queue, entry)
        sent = None if body is None else body.get("message_timestamp")
        return float(sent) if isinstance(sent, (int, float)) else None


TOOLS = DramatiqTools()
