"""Dramatiq messages on belayq in the trace that sent them (``belayq[otel]``).

:class:`belayq.otel.BelayqInstrumentor` loads :func:`install` through the ``belayq.otel``
entry point when it instruments; until then :class:`ProcessSpans` (always among the
broker's middleware) does nothing. The core already traces ``enqueue`` (a ``send <queue>``
span: it is a core publish), the claim (``receive <queue>``, linked to it) and the
settlement; this adds the run: each message runs inside a ``process <queue>`` span
(CONSUMER) under the context of the trace that sent it, so the spans the actor makes join
that trace. A run that raises leaves it with status ERROR.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware

from belayq import Delivery

#: The instrumentation's tracing while instrumented (set by :func:`install`).
_tracing: Any = None
_SPAN = "_belayq_process_span"


def install(tracing: Any) -> Callable[[], None]:
    """Turn the process spans on; returns what turns them off."""
    global _tracing
    _tracing = tracing

    def undo() -> None:
        global _tracing
        _tracing = None

    return undo


class ProcessSpans(Middleware):
    """Runs each message inside its ``process <queue>`` span while tracing is on."""

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        tracing = _tracing
        delivery = getattr(message, "belayq_delivery", None)
        if tracing is None or not isinstance(delivery, Delivery):
            return
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind

        from belayq.otel import SYSTEM, context_of

        attributes = {
            "messaging.system": SYSTEM, "messaging.destination.name": message.queue_name,
            "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.message.id": delivery.id, "belayq.delivery": delivery.deliveries,
            "belayq.attempt": delivery.attempts, "dramatiq.actor": message.actor_name,
        }
        span = tracing.tracer.start_span(f"process {message.queue_name}",
                                         context=context_of(delivery),
                                         kind=SpanKind.CONSUMER, attributes=attributes)
        token = context.attach(trace.set_span_in_context(span))
        setattr(message, _SPAN, (span, token))

    def after_process_message(
        self, broker: dramatiq.Broker, message: MessageProxy, *, result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._end(message, exception)

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._end(message, None)

    @staticmethod
    def _end(message: MessageProxy, exception: BaseException | None) -> None:
        held = vars(message).pop(_SPAN, None)
        if held is None:
            return
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        span, token = held
        if exception is not None:
            span.record_exception(exception)
            span.set_status(Status(StatusCode.ERROR, f"{type(exception).__name__}: {exception}"))
        context.detach(token)
        span.end()
