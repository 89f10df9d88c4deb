"""Celery's ETA and countdown, as the transport reads them off a message: whether a message
may wait in Redis (the queue's delayed set) instead of in a worker's memory.

Celery (task protocol 2) puts a task's ETA in the ``eta`` header as an ISO 8601 time with
its offset; a ``countdown`` becomes an ETA on the producer. Protocol 1 (the ETA in the
body) and an ETA without an offset (Celery reads it in the worker's timezone setting, which
the transport cannot see) are left to the worker, as with the stock transport.

The wait is measured on the clock of the process that reads the message, and the core adds
it to the Redis server's clock: a producer whose clock is off by a second makes its tasks
due a second early or late, as its own ETAs already are, whatever the server's clock says.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from kombu import serialization as _serialization

serialization: Any = _serialization  # kombu's annotations are partial; Any to mypy --strict


def eta_ms(message: dict[str, Any]) -> float | None:
    """The message's ETA in ms since the epoch; None when it has none this module reads."""
    headers = message.get("headers")
    eta = headers.get("eta") if isinstance(headers, dict) else None
    if not isinstance(eta, str):
        return None
    try:
        when = datetime.fromisoformat(eta)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp() * 1000


def wait_ms(message: dict[str, Any], now_ms: float) -> int:
    """How long until the message's ETA (ms, 0 when it has none or it has passed)."""
    eta = eta_ms(message)
    return 0 if eta is None else max(0, round(eta - now_ms))


def task_id(message: dict[str, Any]) -> str | None:
    """The Celery task id of a message (protocol 2 ``id`` header), if any."""
    headers = message.get("headers")
    found = headers.get("id") if isinstance(headers, dict) else None
    return found if isinstance(found, str) else None


def revoked_task_ids(
    exchange: str, message: dict[str, Any], decode_body: Callable[[Any, Any], Any]
) -> list[str]:
    """The task ids a Celery revoke broadcast names (``celery control revoke``,
    ``AsyncResult.revoke()``), read off the message the producer publishes to Celery's
    ``<namespace>.pidbox`` fanout exchange; [] for any other message. Only JSON bodies (the
    default control serializer) are read."""
    if not exchange.endswith(".pidbox"):
        return []
    try:
        props = message.get("properties") or {}
        body = decode_body(message["body"], props.get("body_encoding"))
        payload = serialization.loads(
            body, message.get("content-type"), message.get("content-encoding") or "utf-8",
            accept={"application/json"},
        )
    except Exception:
        return []
    if not isinstance(payload, dict) or payload.get("method") != "revoke":
        return []
    arguments = payload.get("arguments")
    ids = arguments.get("task_id") if isinstance(arguments, dict) else None
    if isinstance(ids, str):
        return [ids]
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
