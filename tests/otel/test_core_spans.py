"""OpenTelemetry spans of the core API (belayq.otel), read back from the SDK's in-memory
exporter: names, kinds, attributes, the producer-consumer link, a reclaim, a stale ack, a
dead-lettering, and what an uninstrumented process imports."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from belayq.otel import BelayqInstrumentor, context_of
from belayq.publishing import Publishing


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    BelayqInstrumentor().instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        BelayqInstrumentor().uninstrument()


def _named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_publish_claim_ack_spans_and_the_link(r: Any, make_queue: Any, spans: Any) -> None:
    q = make_queue(r)
    mid = q.publish(b"x")
    [d] = q.claim(timeout=0)
    assert q.ack(d)

    [send] = _named(spans, "send ")
    [receive] = _named(spans, "receive ")
    [settle] = _named(spans, "settle ")
    assert send.name == f"send {q.name}" and send.kind == SpanKind.PRODUCER
    assert dict(send.attributes or {}) == {
        "messaging.system": "belayq",
        "messaging.destination.name": q.name,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.message.id": mid,
    }
    assert receive.name == f"receive {q.name}" and receive.kind == SpanKind.CLIENT
    attrs = dict(receive.attributes or {})
    assert attrs["messaging.operation.type"] == "receive"
    assert attrs["messaging.message.id"] == mid
    assert (attrs["belayq.delivery"], attrs["belayq.attempt"]) == (1, d.attempts)
    assert [link.context.span_id for link in receive.links] == [send.context.span_id]
    assert receive.events == ()
    assert settle.kind == SpanKind.CLIENT
    assert dict(settle.attributes or {})["messaging.operation.name"] == "ack"
    assert dict(settle.attributes or {})["messaging.operation.type"] == "settle"
    assert settle.events == ()


def test_a_consumer_span_joins_the_trace_that_published(
    r: Any, make_queue: Any, spans: Any
) -> None:
    q = make_queue(r)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("web request") as request:
        q.publish(b"x")
    [d] = q.claim(timeout=0)
    with tracer.start_as_current_span("process", context=context_of(d)) as process:
        pass
    assert process.get_span_context().trace_id == request.get_span_context().trace_id
    [send] = _named(spans, "send ")
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id


@pytest.mark.parametrize("payload", [b"job-7f3a", b'{"task": "an envelope", "x": "' + b"y" * 60,
                                     "é".encode()], ids=["own id", "long", "not ascii"])
def test_a_queue_whose_lists_hold_the_payloads_links_too(
    r: Any, make_queue: Any, spans: Any, payload: bytes
) -> None:
    """There the message's id is the payload's own (or its digest), not the one drawn for
    the publish: the context is kept under it, and the receive links to the send. Identical
    payloads share it: their claims link to the last one's send."""
    q = make_queue(r, ready_key=f"inline-{len(payload)}", payload_in_list=True)
    first = q.publish(payload)
    second = q.publish(payload + b"2")
    got = q.claim(count=2, timeout=0)
    sends = {s.attributes["messaging.message.id"]: s for s in _named(spans, "send ")}
    assert set(sends) == {first, second} == {d.id for d in got}
    [receive] = _named(spans, "receive ")
    assert sorted((link.attributes["messaging.message.id"], link.context.span_id)
                  for link in receive.links) == sorted(
        (mid, s.context.span_id) for mid, s in sends.items())
    assert q.ack_many(got) == [True, True]

    spans.clear()
    q.publish(payload)
    q.publish(payload)
    got = q.claim(count=2, timeout=0)
    assert len({d.id for d in got}) == 2  # a copy's id carries its number
    [receive] = _named(spans, "receive ")
    last = _named(spans, "send ")[-1]
    assert [link.context.span_id for link in receive.links] == [last.context.span_id] * 2


def test_a_batch_is_one_span_and_a_claim_of_many_links_each(
    r: Any, make_queue: Any, spans: Any
) -> None:
    q = make_queue(r)
    q.publish_many([b"a", b"b", b"c"])
    q.publish(b"d")
    got = q.claim(timeout=0, count=10)
    assert len(got) == 4
    sends = _named(spans, "send ")
    assert [dict(s.attributes or {}).get("messaging.batch.message_count") for s in sends] == [
        3, None
    ]
    [receive] = _named(spans, "receive ")
    assert dict(receive.attributes or {})["messaging.batch.message_count"] == 4
    assert sorted(link.context.span_id for link in receive.links) == sorted(
        [sends[0].context.span_id] * 3 + [sends[1].context.span_id]
    )


def test_a_reclaim_is_an_event_of_the_second_receive_and_the_late_ack_is_stale(
    r: Any, make_queue: Any, spans: Any
) -> None:
    q = make_queue(r, lease_ms=100)
    q.publish(b"x")
    [first] = q.claim(timeout=0)
    time.sleep(0.2)
    q.sweep()
    [second] = q.claim(timeout=0)
    assert second.deliveries == 2
    assert q.ack(first) is False
    assert q.ack(second) is True
    one, two = _named(spans, "receive ")
    assert one.events == ()
    [event] = two.events
    assert event.name == "reclaim"
    assert dict(event.attributes or {})["belayq.delivery"] == 2
    assert len(two.links) == 1  # the publisher, again
    stale, ok = _named(spans, "settle ")
    assert [e.name for e in stale.events] == ["stale_ack"]
    assert ok.events == ()


def test_nack_and_dead_letter_spans(r: Any, make_queue: Any, spans: Any) -> None:
    q = make_queue(r, max_deliveries=1)
    q.publish(b"a")
    q.publish(b"b")
    d1, d2 = q.claim(timeout=0, count=2)
    assert q.nack(d1, reason="boom") == "dead"
    assert q.dead_letter(d2, "malformed")
    nack, dead = _named(spans, "settle ")
    assert dict(nack.attributes or {})["messaging.operation.name"] == "nack"
    assert [e.name for e in nack.events] == ["dead_letter"]
    assert dict(dead.attributes or {})["messaging.operation.name"] == "dead_letter"
    assert [e.name for e in dead.events] == ["dead_letter"]


def test_a_failed_call_is_an_error_span(r: Any, make_queue: Any, spans: Any) -> None:
    q = make_queue(r)
    with pytest.raises(Exception, match="priority"):
        q.publish(b"x", priority=10_000)
    [send] = _named(spans, "send ")
    assert send.status.status_code == trace.StatusCode.ERROR


def test_uninstrumented_queues_emit_nothing_and_restore_the_methods(
    r: Any, make_queue: Any
) -> None:
    original = Publishing.__dict__["publish_result"]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    BelayqInstrumentor().instrument(tracer_provider=provider)
    assert Publishing.__dict__["publish_result"] is not original
    BelayqInstrumentor().uninstrument()
    assert Publishing.__dict__["publish_result"] is original
    q = make_queue(r)
    q.publish(b"x")
    assert r.exists(q.keys.meta) == 0  # no context kept
    [d] = q.claim(timeout=0)
    q.ack(d)
    assert exporter.get_finished_spans() == ()


def test_a_bad_context_ttl_is_refused_and_patches_nothing() -> None:
    original = Publishing.__dict__["publish_result"]
    with pytest.raises(ValueError, match="context_ttl_s"):
        BelayqInstrumentor().instrument(context_ttl_s=0)
    assert Publishing.__dict__["publish_result"] is original
    BelayqInstrumentor().uninstrument()


def test_context_ttl_s_does_nothing_now_and_says_so(r: Any, make_queue: Any) -> None:
    """The context lives as long as its message, in the queue's meta hash: no key of its
    own, no expiry."""
    provider = TracerProvider()
    with pytest.warns(DeprecationWarning, match="context_ttl_s does nothing"):
        BelayqInstrumentor().instrument(tracer_provider=provider, context_ttl_s=60)
    try:
        q = make_queue(r)
        mid = q.publish(b"x")
    finally:
        BelayqInstrumentor().uninstrument()
    assert r.hget(q.keys.meta, q.keys.context_field(mid)) is not None
    assert r.pttl(q.keys.meta) == -1
    assert r.keys(f"*trace:{mid}") == []


def test_registered_for_opentelemetry_instrument() -> None:
    found = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "belayq"]
    assert [e.value for e in found] == ["belayq.otel:BelayqInstrumentor"]


def test_belayq_alone_imports_no_opentelemetry(redis_server: Any) -> None:
    """redis-py 8 imports OpenTelemetry itself when it is installed; belayq and its
    adapters add nothing."""
    code = (
        "import sys, redis\n"
        f"c = redis.Redis(port={redis_server.port}); c.ping()\n"
        "before = {m for m in sys.modules if 'opentelemetry' in m or m == 'belayq.otel'}\n"
        "import belayq\n"
        "q = belayq.ReliableQueue(c, 'otel-free', keeper=False)\n"
        "q.publish(b'x'); [d] = q.claim(timeout=0); q.ack(d); q.close()\n"
        "import belayq_kombu, belayq_rq, belayq_kombu.delivering\n"  # the adapters too
        "assert belayq_kombu.delivering.trace_headers is None\n"
        "after = {m for m in sys.modules if 'opentelemetry' in m or m.endswith(\n"
        "         ('.otel', '.tracing'))}\n"
        "print(sorted(after - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_queue_built_before_instrumenting_is_traced(r: Any, make_queue: Any) -> None:
    q = make_queue(r)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    BelayqInstrumentor().instrument(tracer_provider=provider)
    try:
        q.publish(b"x")
    finally:
        BelayqInstrumentor().uninstrument()
    assert [s.name for s in _named(exporter, "send ")] == [f"send {q.name}"]
