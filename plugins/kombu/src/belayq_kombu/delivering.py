"""What a channel hands kombu for claimed messages: each message's envelope, with a delivery
tag minted for its claim and the claim stamped for the process that will run it (see
:mod:`.starts`); and what it settles itself for the claims kombu never sees (malformed,
expired, an ETA still ahead), through :func:`.tags.settle`, so that no such claim is kept
alive with nobody to settle it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import time
from typing import TYPE_CHECKING, Any

from kombu.utils import json as _json

from belayq.observing import PUBLISHED_PROPERTY

from . import celery_state, eta, options, starts
from .tags import settle, tag_of

if TYPE_CHECKING:
    from belayq import Delivery, ReliableQueue

    from .channel import Channel

log = logging.getLogger("belayq.kombu")

loads: Any = _json.loads  # kombu's annotations are partial; Any to mypy --strict

#: Property belayq:// stamps on every message it publishes (ms since the epoch, the
#: publisher's clock). Stock producers' messages carry none.
PUBLISHED_MS = PUBLISHED_PROPERTY


def _published_ms(props: dict[str, Any]) -> float | None:
    try:
        return float(props[PUBLISHED_MS])
    except (KeyError, TypeError, ValueError):
        return None

#: The trace headers of a claimed message's publisher, while tracing is on
#: (:mod:`.tracing`); None otherwise.
trace_headers: Callable[[Delivery], dict[str, str]] | None = None


def envelopes(
    channel: Channel, queue: str, rq: ReliableQueue, deliveries: list[Delivery], *,
    no_ack: bool
) -> list[tuple[dict[str, Any], Any]]:
    """The kombu envelopes of claimed messages, each with its delivery tag. Claims kombu
    will not see are settled here: malformed ones dead-lettered, expired ones acked,
    ones whose ETA is ahead deferred (through :func:`.tags.settle`: never held by
    nobody when Redis cannot be reached)."""
    out: list[tuple[dict[str, Any], Any]] = []
    settle_now: list[Delivery] = []
    malformed: list[tuple[Delivery, str]] = []
    deferred: list[tuple[Delivery, int]] = []
    scheduled: dict[Any, str] = {}  # delivery tag -> task id, of the messages with an ETA
    defer = channel.native_delayed_delivery and not no_ack
    now_ms = time() * 1000
    for d in deliveries:
        try:
            raw = loads(d.payload.decode("utf-8"))
            props = raw["properties"]
            if not isinstance(props, dict):
                raise TypeError(f"properties is a {type(props).__name__}, not an object")
        except Exception as exc:
            malformed.append((d, f"not a kombu message: {exc!r}"))
            continue
        if _expired(raw):
            settle_now.append(d)
            continue
        wait = eta.wait_ms(raw, now_ms)
        if defer and wait > options.DEFER_MIN_S * 1000:
            deferred.append((d, wait))  # a stock producer's, or an older belayq's
            continue
        if d.deliveries == 1:
            rq.first_claimed(d, _published_ms(props))
        tag = tag_of(queue, d)
        task_id = eta.task_id(raw)
        if task_id is not None and eta.eta_ms(raw) is not None:
            scheduled[tag] = task_id
        props["delivery_tag"] = tag
        if d.deliveries > 1:
            info = props.get("delivery_info")
            if isinstance(info, dict):
                info["redelivered"] = True
        if no_ack:
            starts.stamp(props, queue, None)
            settle_now.append(d)
        else:
            starts.stamp(props, queue, d)
            channel.claims.add(tag, rq, d)
        if trace_headers is not None:
            _add_trace_headers(raw, trace_headers(d))
        out.append((raw, tag))
    for d, reason in malformed:
        settle(rq, "dead", [d], reason)
    settle(rq, "ack", settle_now)
    if deferred:
        settle(rq, "defer", [d for d, _ in deferred],
               delays_ms=[wait for _, wait in deferred])
    if scheduled:
        out = _revoked_first(channel, out, scheduled)
    return out

def _add_trace_headers(raw: dict[str, Any], carrier: dict[str, str]) -> None:
    """Give the task the trace headers of its publisher, unless its producer set its own."""
    headers = raw.get("headers")
    if carrier and isinstance(headers, dict) and "traceparent" not in headers:
        headers.update(carrier)


def _revoked_first(
    channel: Channel, out: list[tuple[dict[str, Any], Any]], scheduled: dict[Any, str]
) -> list[tuple[dict[str, Any], Any]]:
    """Tell the Celery worker in this process which of these scheduled tasks were
    revoked while they waited (it may have forgotten, or started since): Celery then
    marks them REVOKED and acks them instead of running them. When Redis cannot say,
    their claims are abandoned (they come back after their lease, and are asked about
    again) rather than run unchecked; ``out`` without them is returned."""
    try:
        revoked = channel.connection.revocations(channel).revoked(list(scheduled.values()))
    except Exception as exc:
        held = [tag for tag in scheduled if channel.claims.get(tag) is not None]
        log.warning("could not check %d scheduled task(s) for revokes (%r); they are "
                    "delivered again after their lease", len(held), exc)
        for tag in held:
            channel.claims.abandon(tag)
        return [(raw, tag) for raw, tag in out if tag not in held]
    if revoked:
        celery_state.remember_revoked(revoked)
    return out


def _expired(raw: dict[str, Any]) -> bool:
    """An AMQP ``expiration`` (per-message TTL) ran out. A Celery task that expires is left
    to Celery (its ``expires`` header): Celery marks it REVOKED, as with the stock Redis
    transport, where a silent drop would leave its result PENDING for ever."""
    props = raw["properties"]
    expiration, published = props.get("expiration"), props.get(PUBLISHED_MS)
    if expiration is None or published is None:
        return False
    if (raw.get("headers") or {}).get("expires") is not None:
        return False
    try:
        return time() * 1000 >= int(published) + int(expiration)
    except (TypeError, ValueError):
        return False
