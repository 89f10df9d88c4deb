"""Where a message's trace context travels (``belayq.otel``), and the contexts of the
claims this process holds.

A publish keeps the current context in a key of the queue's own, beside the message
(``<queue prefix>trace:<id>``, in the queue's hash slot), that expires on its own; a claim
reads its messages' keys back with one MGET, and keeps each producer context until the
claim is settled, for :func:`context_of` and :func:`carrier_of`.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate

from .models import Delivery, entry_id
from .sent import pool_connection

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
log = logging.getLogger("belayq")


def nothing() -> None:
    """What reads no reply."""
    return None


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


def published_id(group: Sequence[Any], inline: bool) -> str:
    """The id a publish's message will have: the one drawn for it, or, in a queue whose lists
    hold the payloads, the payload's own (see :func:`~belayq.models.entry_id`)."""
    if not inline:
        return str(group[0])
    payload = group[1]
    return entry_id(payload.encode("utf-8") if isinstance(payload, str) else bytes(payload),
                    inline)


def trace_key(queue: Any, message_id: str) -> str:
    key: str = queue.keys.trace(message_id)
    return key


def context_value() -> str | None:
    """The current context as a trace key holds it; None when there is none."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, separators=(",", ":")) if carrier else None

def store(client: Any, keys: Sequence[str], value: str | None, ttl_ms: int
          ) -> Callable[[], None]:
    """Write ``value`` (a context, :func:`context_value`) to the trace keys ``keys``, sent
    now and read when the returned function is called (once), so it costs no round trip of
    its own; a cluster client waits for it. Never raises: tracing never fails a publish."""
    if value is None or not keys:
        return nothing
    commands = [("SET", key, value, "PX", ttl_ms) for key in keys]
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # a cluster client routes each key itself
        try:
            with client.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                pipe.execute()
        except Exception as exc:  # tracing never fails a publish
            log.debug("could not store the trace context at %s: %s", keys, exc)
        return nothing
    conn = pool_connection(pool)
    try:
        conn.send_packed_command(conn.pack_commands(commands))
    except Exception as exc:  # tracing never fails a publish
        conn.disconnect()
        pool.release(conn)
        log.debug("could not store the trace context at %s: %s", keys, exc)
        return nothing

    def read() -> None:
        try:
            for _ in commands:
                conn.read_response()
        except Exception as exc:
            conn.disconnect()
            log.debug("could not store the trace context at %s: %s", keys, exc)
        finally:
            pool.release(conn)

    return read


def producers(queue: Any, got: Sequence[Delivery]) -> list[otel_context.Context]:
    """The publishers' contexts of the messages ``got`` (one MGET); an empty context for
    each when they cannot be read (tracing never fails a claim)."""
    try:
        raw = queue.client.mget([trace_key(queue, d.id.split(" #")[0]) for d in got])
    except Exception:  # tracing never fails a claim
        return [otel_context.Context() for _ in got]
    out = []
    for value in raw:
        carrier: dict[str, str] = {}
        if value:
            try:
                carrier = json.loads(value)
            except ValueError:
                carrier = {}
        out.append(propagate.extract(carrier, context=otel_context.Context()))
    return out
