"""OpenTelemetry tracing of belayq's queues (``pip install "belayq[otel]"``).

:class:`BelayqInstrumentor` follows ``opentelemetry-instrumentation``'s ``BaseInstrumentor``
API and is registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument`` turns it on. Once instrumented, every
:class:`~belayq.ReliableQueue` (and each shard of a :class:`~belayq.ShardedQueue`) emits,
following OpenTelemetry's messaging semantic conventions:

* ``send <queue>`` (PRODUCER) for each publish; a batch publish is one span with
  ``messaging.batch.message_count``;
* ``receive <queue>`` (CLIENT) for each claim that returns messages, linked to the send span
  of each message it returns, with an event ``reclaim`` for each message delivered before
  (its lease ran out, or it was nacked or released);
* ``settle <queue>`` (CLIENT) for each ack, nack and dead-lettering
  (``messaging.operation.name`` ``ack``, ``nack``, ``dead_letter``), with an event
  ``stale_ack`` when another claim holds the message now and ``dead_letter`` when the
  message goes to the dead letters.

Attributes: ``messaging.system`` ``"belayq"``, ``messaging.destination.name``,
``messaging.operation.type``, ``messaging.message.id`` (one message), and ``belayq.delivery``
and ``belayq.attempt`` (one claim).

The send span's context rides with the message: the publish script that stores the message
keeps it in a field of the queue's ``meta`` hash (``"<id> trace"``, in the queue's hash
slot), in the same call, and the scripts that delete the message (ack, purge, drop, the
deletion of a dead letter or of the oldest beyond the cap) delete it too. It costs no
connection and no round trip of its own at the publish, and one HMGET per claim that
returns messages. A context that cannot be kept (longer than 8 KiB) is not: the messages
are published untraced, counted in the queue's ``untraced`` counter. Stock producers and
consumers never see it. A consumer that runs the message starts its own span under
:func:`context_of`, so it joins the trace that published it.

Nothing here is imported by belayq itself, and an uninstrumented queue runs none of it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sys
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,  # its __all__ leaves it out
)
from opentelemetry.trace import Link, SpanKind

from . import __version__
from .holding import HeldClaims
from .models import Delivery
from .otel_context import CONTEXTS, carrier_of, context_of, context_value, producers
from .publishing import Publishing
from .settling import Settling

log = logging.getLogger("belayq")

SYSTEM = "belayq"
#: The former default of ``instrument(context_ttl_s=...)``, which no longer does anything: a
#: message's trace context lives exactly as long as the message.
CONTEXT_TTL_S = 86_400
#: The entry point group of the adapters' tracing hooks: each names a callable that takes
#: the instrumentation's :class:`_Tracing` when ``instrument()`` runs and returns what
#: undoes it.
HOOKS = "belayq.otel"
#: Inside a settle span: a settle call it makes (a send that falls back to a waited ack)
#: opens no second one.
_SETTLING: contextvars.ContextVar[bool] = contextvars.ContextVar("belayq_settling", default=False)


def _base(queue: Any, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue.sharded_as or queue.name,
        "messaging.operation.type": operation,
    }


def _claim_attributes(d: Delivery) -> dict[str, Any]:
    return {"messaging.message.id": d.id, "belayq.delivery": d.deliveries,
            "belayq.attempt": d.attempts}


class _Tracing:
    """The wrappers one :meth:`BelayqInstrumentor.instrument` installs."""

    def __init__(self, tracer: trace.Tracer, provider: Any) -> None:
        self.tracer = tracer
        self.provider = provider
        # The most links a span keeps (the SDK's span limits; no bound for another tracer):
        # a claim of many messages builds no link its span would drop.
        limits = getattr(tracer, "_span_limits", None)
        found = getattr(limits, "max_links", None)
        self.links_max = found if isinstance(found, int) and found >= 0 else sys.maxsize

    # -- send --------------------------------------------------------------------------

    def context_value(self) -> str:
        """The current context as a message keeps it ('' when there is none), for the
        adapters' hooks that store it beside a message the framework pushes itself."""
        return context_value()

    def publish_groups(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(queue: Any, groups: Any, *rest: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("trace_context", context_value())
            return original(queue, groups, *rest, **kwargs)

        return wrapper

    def publish_result(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(queue: Any, *args: Any, **kwargs: Any) -> Any:
            name = queue.sharded_as or queue.name
            with self.tracer.start_as_current_span(
                f"send {name}", kind=SpanKind.PRODUCER, attributes=_base(queue, "send")
            ) as span:
                span.set_attribute("messaging.operation.name", "publish")
                published = original(queue, *args, **kwargs)
                span.set_attribute("messaging.message.id", published.id)
                return published

        return wrapper

    def publish_many(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(queue: Any, payloads: Any, *args: Any, **kwargs: Any) -> Any:
            payloads = list(payloads)
            name = queue.sharded_as or queue.name
            with self.tracer.start_as_current_span(
                f"send {name}", kind=SpanKind.PRODUCER, attributes=_base(queue, "send")
            ) as span:
                span.set_attribute("messaging.operation.name", "publish")
                span.set_attribute("messaging.batch.message_count", len(payloads))
                return original(queue, payloads, *args, **kwargs)

        return wrapper

    # -- receive -----------------------------------------------------------------------

    def take(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(queue: Any, flat: Any) -> Any:
            got: list[Delivery] = original(queue, flat)
            if not got:
                return got
            contexts = producers(queue, got)
            links: list[Link] = []
            for d, ctx in zip(got, contexts, strict=True):
                producer = trace.get_current_span(ctx).get_span_context()
                if producer.is_valid:
                    if len(links) < self.links_max:  # the SDK would drop the rest
                        links.append(Link(producer, {"messaging.message.id": d.id}))
                    CONTEXTS.keep(d, ctx)
            name = queue.sharded_as or queue.name
            attributes = _base(queue, "receive")
            attributes["messaging.operation.name"] = "claim"
            if len(got) == 1:
                attributes.update(_claim_attributes(got[0]))
            else:
                attributes["messaging.batch.message_count"] = len(got)
            with self.tracer.start_as_current_span(
                f"receive {name}", kind=SpanKind.CLIENT, attributes=attributes, links=links
            ) as span:
                for d in got:
                    if d.deliveries > 1:
                        span.add_event("reclaim", _claim_attributes(d))
            return got

        return wrapper

    # -- settle ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _settle_span(
        self, queue: Any, operation: str, deliveries: Sequence[Delivery]
    ) -> Iterator[Any]:
        if _SETTLING.get():
            yield trace.INVALID_SPAN
            return
        token = _SETTLING.set(True)
        try:
            with self._settle_span_now(queue, operation, deliveries) as span:
                yield span
        finally:
            _SETTLING.reset(token)

    def _settle_span_now(
        self, queue: Any, operation: str, deliveries: Sequence[Delivery]
    ) -> Any:
        name = queue.sharded_as or queue.name
        attributes = _base(queue, "settle")
        attributes["messaging.operation.name"] = operation
        if len(deliveries) == 1:
            attributes.update(_claim_attributes(deliveries[0]))
        else:
            attributes["messaging.batch.message_count"] = len(deliveries)
        return self.tracer.start_as_current_span(
            f"settle {name}", kind=SpanKind.CLIENT, attributes=attributes
        )

    def ack_many(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(queue: Any, deliveries: Any, *args: Any, **kwargs: Any) -> Any:
            deliveries = list(deliveries) if isinstance(deliveries, Sequence) else deliveries
            if not isinstance(deliveries, list) or not deliveries:
                return original(queue, deliveries, *args, **kwargs)
            with self._settle_span(queue, "ack", deliveries) as span:
                acked = original(queue, deliveries, *args, **kwargs)
                for d, ok in zip(deliveries, acked, strict=False):
                    if not ok:
                        span.add_event("stale_ack", _claim_attributes(d))
            CONTEXTS.drop(deliveries)
            return acked

        return wrapper

    def send_ack_many(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(queue: Any, deliveries: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(deliveries, Sequence) or not deliveries:
                return original(queue, deliveries, *args, **kwargs)
            with self._settle_span(queue, "ack", list(deliveries)):
                answer = original(queue, deliveries, *args, **kwargs)
            CONTEXTS.drop(deliveries)
            return answer

        return wrapper

    def ack_on(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(queue: Any, pipeline: Any, deliveries: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(deliveries, Sequence) or not deliveries:
                return original(queue, pipeline, deliveries, *args, **kwargs)
            with self._settle_span(queue, "ack", list(deliveries)) as span:
                span.set_attribute("belayq.in_transaction", True)
                out = original(queue, pipeline, deliveries, *args, **kwargs)
            CONTEXTS.drop(deliveries)
            return out

        return wrapper

    def _settle_one(self, operation: str, event_of: Callable[[Any], str | None]
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The wrapper of a settle of one claim (``nack``, ``dead_letter``), whose span gets
        the event ``event_of(outcome)`` names (none for None)."""
        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(queue: Any, delivery: Any, *args: Any, **kwargs: Any) -> Any:
                if not isinstance(delivery, Delivery):
                    return original(queue, delivery, *args, **kwargs)
                with self._settle_span(queue, operation, [delivery]) as span:
                    outcome = original(queue, delivery, *args, **kwargs)
                    if isinstance(outcome, str):
                        span.set_attribute("belayq.outcome", outcome)
                    event = event_of(outcome)
                    if event is not None:
                        span.add_event(event, _claim_attributes(delivery))
                CONTEXTS.drop([delivery])
                return outcome

            return wrapper

        return wrap

    def nack(self, original: Callable[..., Any]) -> Callable[..., Any]:
        events = {"dead": "dead_letter", "stale": "stale_ack"}
        return self._settle_one("nack", events.get)(original)

    def dead_letter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        return self._settle_one(
            "dead_letter", lambda dead: "dead_letter" if dead else "stale_ack")(original)


#: (class, method name, the _Tracing method that wraps it)
_WRAPPED: tuple[tuple[type, str, str], ...] = (
    (Publishing, "publish_result", "publish_result"),
    (Publishing, "publish_many", "publish_many"),
    (Publishing, "_publish_groups", "publish_groups"),
    (HeldClaims, "_take", "take"),
    (Settling, "ack_many", "ack_many"),
    (Settling, "send_ack_many", "send_ack_many"),
    (Settling, "ack_on", "ack_on"),
    (Settling, "nack", "nack"),
    (Settling, "dead_letter", "dead_letter"),
)


class BelayqInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces belayq's publishes, claims and settlements (see the module doc).

    ``BelayqInstrumentor().instrument(tracer_provider=...)``; ``uninstrument()`` puts
    everything back.
    """

    _originals: dict[tuple[type, str], Any]
    _undo: list[Callable[[], None]]

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("belayq >= 0.2",)

    def _instrument(self, **kwargs: Any) -> None:
        ttl = kwargs.get("context_ttl_s", CONTEXT_TTL_S)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 1:
            raise ValueError(f"context_ttl_s must be an int >= 1, got {ttl!r}")
        if "context_ttl_s" in kwargs:
            warnings.warn("context_ttl_s does nothing: a message's trace context is kept "
                          "with the message and deleted with it", DeprecationWarning,
                          stacklevel=3)
        provider = kwargs.get("tracer_provider") or trace.get_tracer_provider()
        tracer = trace.get_tracer(
            "belayq", __version__, tracer_provider=provider,
            schema_url="https://opentelemetry.io/schemas/1.26.0",
        )
        tracing = _Tracing(tracer, provider)
        self._originals = {}
        for cls, name, how in _WRAPPED:
            original = cls.__dict__[name]
            self._originals[(cls, name)] = original
            setattr(cls, name, getattr(tracing, how)(original))
        self._undo = []
        for hook in entry_points(group=HOOKS):
            try:
                self._undo.append(hook.load()(tracing))
            except ImportError as exc:  # an adapter installed without its framework
                log.debug("belayq tracing hook %s not installed: %s", hook.name, exc)

    def _uninstrument(self, **kwargs: Any) -> None:
        for undo in reversed(getattr(self, "_undo", [])):
            undo()
        self._undo = []
        for (cls, name), original in getattr(self, "_originals", {}).items():
            setattr(cls, name, original)
        self._originals = {}


__all__ = ["CONTEXT_TTL_S", "BelayqInstrumentor", "carrier_of", "context_of"]
