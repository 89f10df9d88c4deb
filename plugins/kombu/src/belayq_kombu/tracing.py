"""Celery tasks on ``belayq://`` in the trace that published them (``belayq[otel]``).

:class:`belayq.otel.BelayqInstrumentor` loads this module through the ``belayq.otel``
entry point when it instruments; nothing here runs otherwise. Once on:

* a delivered message carries its publisher's trace headers (``traceparent``,
  ``tracestate``) in its task headers, unless its producer's own instrumentation put some
  there already. Celery's instrumentation (``opentelemetry-instrumentation-celery``) reads
  them, so its ``run/<task>`` span joins the trace of a producer that only belayq traced;
* without Celery's instrumentation, each task runs inside a ``process <queue>`` span
  (CONSUMER) started from those headers, so the spans a task makes join the trace that
  published it. A task that raises leaves that span with status ERROR.

The headers travel in the worker's copy of the message only: Redis and stock consumers
never see them.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode

from belayq.otel import SYSTEM, carrier_of

from . import delivering
from .starts import CLAIM_PROPERTY

_UID = "belayq-otel"


class _RequestGetter(Getter[Any]):
    """Reads trace headers from a Celery task request (its headers are its attributes)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


_GETTER = _RequestGetter()


def _celery_traces() -> bool:
    """Whether Celery's own instrumentation is on in this process (it makes the task's
    span then)."""
    try:
        module: Any = importlib.import_module("opentelemetry.instrumentation.celery")
    except ImportError:
        return False
    return bool(module.CeleryInstrumentor().is_instrumented_by_opentelemetry)


class _Runs:
    """The ``process`` spans of the tasks running in this process, by task id."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer
        self._lock = threading.Lock()
        self._open: dict[str, tuple[trace.Span, object]] = {}

    def prerun(self, task_id: str | None = None, task: Any = None, **_: Any) -> None:
        if task_id is None or task is None or _celery_traces():
            return
        request = getattr(task, "request", None)
        parent = propagate.extract(request, getter=_GETTER, context=otel_context.Context())
        props = getattr(request, "properties", None) or {}
        claim = props.get(CLAIM_PROPERTY) if isinstance(props, dict) else None
        info = getattr(request, "delivery_info", None) or {}
        queue = claim[0] if isinstance(claim, list) and claim else info.get("routing_key")
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": claim[1] if isinstance(claim, list) and len(claim) > 1
            else task_id,
            "celery.task_name": str(getattr(task, "name", "")),
        }
        if queue:
            attributes["messaging.destination.name"] = str(queue)
        span = self.tracer.start_span(
            f"process {queue or task.name}", context=parent, kind=SpanKind.CONSUMER,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        with self._lock:
            self._open[task_id] = (span, token)

    def failure(self, task_id: str | None = None, exception: BaseException | None = None,
                **_: Any) -> None:
        with self._lock:
            found = self._open.get(task_id or "")
        if found is None:
            return
        span = found[0]
        if exception is not None:
            span.record_exception(exception)
            span.set_status(Status(StatusCode.ERROR, f"{type(exception).__name__}: {exception}"))

    def postrun(self, task_id: str | None = None, state: str | None = None, **_: Any) -> None:
        with self._lock:
            found = self._open.pop(task_id or "", None)
        if found is None:
            return
        span, token = found
        if state:
            span.set_attribute("celery.state", state)
        otel_context.detach(token)  # type: ignore[arg-type]
        span.end()


def install(tracing: Any) -> Callable[[], None]:
    """Turn the tracing of Celery tasks on (``tracing``: belayq.otel's instrumentation);
    returns what turns it off."""
    delivering.trace_headers = carrier_of
    try:
        from celery import signals  # type: ignore[import-untyped]
    except ImportError:  # kombu without Celery: the headers only
        signals = None
    runs = _Runs(tracing.tracer)
    if signals is not None:
        signals.task_prerun.connect(runs.prerun, weak=False, dispatch_uid=_UID)
        signals.task_failure.connect(runs.failure, weak=False, dispatch_uid=_UID)
        signals.task_postrun.connect(runs.postrun, weak=False, dispatch_uid=_UID)

    def undo() -> None:
        delivering.trace_headers = None
        if signals is not None:
            signals.task_prerun.disconnect(dispatch_uid=_UID)
            signals.task_failure.disconnect(dispatch_uid=_UID)
            signals.task_postrun.disconnect(dispatch_uid=_UID)

    return undo
