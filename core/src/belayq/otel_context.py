"""Where a message's trace context travels (``belayq.otel``), and the contexts of the
claims this process holds.

A publish hands the current context to the publish script, which keeps it with each message
it stores, in a field of the queue's ``meta`` hash (:meth:`~belayq.keys.QueueKeys.
context_field`), and deletes it with the message (ack, purge, drop, a dead letter's
deletion). A claim reads its messages' contexts back with one HMGET, and keeps each
producer context until the claim is settled, for :func:`context_of` and :func:`carrier_of`.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate

from .constants import TRACE_CONTEXT_MAX_BYTES
from .models import Delivery

#: Claims whose producer context is kept in this process until they are settled.
_KEPT_MAX = 10_000

_Claim = tuple[str, str, str]  # (queue, id, token)


def _claim_key(d: Delivery) -> _Claim:
    return (d.queue, d.id, d.token)


class _Contexts:
    """The producer contexts of the claims this process holds, for :func:`context_of`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: collections.OrderedDict[_Claim, otel_context.Context] = (
            collections.OrderedDict()
        )

    def keep(self, d: Delivery, ctx: otel_context.Context) -> None:
        with self._lock:
            self._kept[_claim_key(d)] = ctx
            while len(self._kept) > _KEPT_MAX:
                self._kept.popitem(last=False)

    def get(self, d: Delivery) -> otel_context.Context | None:
        with self._lock:
            return self._kept.get(_claim_key(d))

    def drop(self, deliveries: Sequence[Delivery]) -> None:
        with self._lock:
            for d in deliveries:
                self._kept.pop(_claim_key(d), None)


CONTEXTS = _Contexts()


def context_of(delivery: Delivery) -> otel_context.Context:
    """The context to run ``delivery``'s message under: its publisher's, so a span started
    with it joins the trace that published the message. The current context when the
    message carries none (published without instrumentation, or its context expired)."""
    found = CONTEXTS.get(delivery)
    return found if found is not None else otel_context.get_current()


def carrier_of(delivery: Delivery) -> dict[str, str]:
    """The W3C trace headers (``traceparent``, ``tracestate``) of the trace that published
    ``delivery``'s message; empty when it carries none. The adapters hand them to the
    framework's own task headers, so its instrumentation joins the trace too."""
    found = CONTEXTS.get(delivery)
    carrier: dict[str, str] = {}
    if found is not None:
        propagate.inject(carrier, context=found)
    return carrier


def context_value() -> str:
    """The current context as the publish script keeps it (its W3C headers as a JSON
    object); '' when there is none. One too long to keep goes as ``"{}"``, which the script
    does not keep: it publishes the messages untraced and counts them."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return ""
    value = json.dumps(carrier, separators=(",", ":"))
    return value if len(value) <= TRACE_CONTEXT_MAX_BYTES else "{}"


def producers(queue: Any, got: Sequence[Delivery]) -> list[otel_context.Context]:
    """The publishers' contexts of the messages ``got`` (one HMGET of the queue's meta
    hash); an empty context for each when they cannot be read (tracing never fails a
    claim)."""
    keys = queue.keys
    try:
        raw = queue.client.hmget(keys.meta, [keys.context_field(d.id) for d in got])
    except Exception:  # tracing never fails a claim
        return [otel_context.Context() for _ in got]
    seen: dict[Any, otel_context.Context] = {}  # a batch's messages share one context
    out = []
    for value in raw:
        ctx = seen.get(value)
        if ctx is None:
            ctx = seen[value] = _extracted(value)
        out.append(ctx)
    return out


def _extracted(value: bytes | None) -> otel_context.Context:
    """The context a message keeps (:func:`context_value`); empty for none or a bad one."""
    carrier: dict[str, str] = {}
    if value:
        try:
            found = json.loads(value)
        except ValueError:
            found = None
        if isinstance(found, dict):
            carrier = {str(k): str(v) for k, v in found.items()}
    return propagate.extract(carrier, context=otel_context.Context())
