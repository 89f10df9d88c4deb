"""The Dramatiq app of the live-fleet test (``dramatiq tests.web.fleet_dramatiq``), on
``belayq_dramatiq.Broker`` at ``FLEET_PORT``: actors that succeed, fail once and are
retried, and fail until their retries run out (dead-lettered). Each run that raises is
noted in ``fleet:d:raised`` (the message id), as the framework's own count."""

from __future__ import annotations

import os

import dramatiq
import redis

from belayq_dramatiq import Broker

PORT = os.environ.get("FLEET_PORT", "6379")
QUEUE = "fleet_d"
broker = Broker(url=f"redis://127.0.0.1:{PORT}/0", lease_ms=5000)
if not any(isinstance(m, dramatiq.middleware.CurrentMessage) for m in broker.middleware):
    broker.add_middleware(dramatiq.middleware.CurrentMessage())
dramatiq.set_broker(broker)
_record = redis.Redis(port=int(PORT))
RAISED = "fleet:d:raised"


def _raise(message_id: str) -> None:
    _record.rpush(RAISED, message_id)
    raise ValueError("this run fails")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def ok(i: int) -> int:
    return i


@dramatiq.actor(queue_name=QUEUE, max_retries=1, min_backoff=100, max_backoff=200)
def once_flaky(i: int) -> None:
    """Fails its first run only."""
    message = dramatiq.middleware.CurrentMessage.get_current_message()
    if message is not None and not message.options.get("retries"):
        _raise(message.message_id)


@dramatiq.actor(queue_name=QUEUE, max_retries=1, min_backoff=100, max_backoff=200)
def always_fails(i: int) -> None:
    message = dramatiq.middleware.CurrentMessage.get_current_message()
    _raise(message.message_id if message is not None else "?")
