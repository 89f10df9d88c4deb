"""Dramatiq messages on belayq in the trace that sent them (belayq[otel]), with Dramatiq's
own Worker: the core's send, receive and settle spans, and the adapter's process span
around the actor, under the sender's trace; a run that raises leaves it with status ERROR."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from belayq.otel import BelayqInstrumentor
from belayq_dramatiq import Broker
from tests.plugins.dramatiq.inproc import run_with_worker
from tests.support import wait_for


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    BelayqInstrumentor().instrument(tracer_provider=provider)
    try:
        yield provider, memory
    finally:
        BelayqInstrumentor().uninstrument()


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_a_message_runs_in_the_trace_that_sent_it(
    url: str, conn: redis.Redis, traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = traced
    broker = Broker(url=url, lease_ms=2000)
    inner: list[int] = []

    @dramatiq.actor(broker=broker, max_retries=0)
    def work(fail: bool) -> None:
        inner.append(trace.get_current_span().get_span_context().trace_id)
        if fail:
            raise ValueError("boom")

    def body(_: object) -> None:
        with provider.get_tracer("test").start_as_current_span("web request") as request:
            work.send(False)
            work.send(True)
        trace_id = request.get_span_context().trace_id
        wait_for(lambda: len(named(memory.get_finished_spans(), "process default")) == 2,
                 20, lambda: [s.name for s in memory.get_finished_spans()])
        broker.join("default", timeout=10_000)
        spans = memory.get_finished_spans()
        processes = named(spans, "process default")
        assert {s.context.trace_id for s in processes} == {trace_id}
        assert inner == [trace_id, trace_id]  # the actor ran inside it
        statuses = sorted(s.status.status_code.name for s in processes)
        assert statuses == [StatusCode.ERROR.name, StatusCode.UNSET.name]
        assert len(named(spans, "send default")) == 2
        assert named(spans, "receive default")
        settles = [s.attributes.get("messaging.operation.name")
                   for s in named(spans, "settle default")]
        assert sorted(settles) == ["ack", "dead_letter"]  # type: ignore[type-var]

    run_with_worker(broker, body)
