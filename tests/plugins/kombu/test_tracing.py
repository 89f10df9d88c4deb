"""Celery tasks on belayq:// in the trace that published them (belayq[otel]), through real
``celery worker`` processes: the producer's spans are read from the SDK's in-memory
exporter, the worker's (main process and pool children) from the SDK's console exporter
writing a JSON line per span to a file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from belayq.otel import BelayqInstrumentor
from tests.support import wait_for

from .conftest import Worker
from .test_celery_worker import app

Spans = list[dict[str, Any]]


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """The test process (the producer) traced by belayq into an in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    BelayqInstrumentor().instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        BelayqInstrumentor().uninstrument()


def trace_id(span: ReadableSpan) -> str:
    return f"0x{span.context.trace_id:032x}"


def span_id(span: ReadableSpan) -> str:
    return f"0x{span.context.span_id:016x}"


def worker_spans(path: Path, done: Callable[[Spans], bool]) -> Spans:
    """The worker's spans, once ``done`` holds for them."""
    found: Spans = []

    def read() -> bool:
        found[:] = [json.loads(line) for line in path.read_text().splitlines()
                    if line.strip()] if path.exists() else []
        return done(found)

    wait_for(read, 30, "the worker's spans")
    return found


def named(spans: Spans, name: str) -> Spans:
    return [s for s in spans if s["name"] == name]


def sent_ids(exporter: InMemorySpanExporter, kq: str) -> dict[str, ReadableSpan]:
    """The producer's send spans, by the belayq message id they published."""
    return {str((s.attributes or {})["messaging.message.id"]): s
            for s in exporter.get_finished_spans() if s.name == f"send {kq}"}


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_task_runs_in_the_trace_that_published_it_without_celerys_instrumentation(
    pool: str, workers: Callable[..., Worker], celery_env: dict[str, str], kq: str,
    tmp_path: Path, provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    path = tmp_path / "worker-spans.jsonl"
    workers("-P", pool, "-c", "2", BQ_TRACE_FILE=str(path)).wait_ready()
    tracer_provider, exporter = provider
    mod = app(celery_env)
    with tracer_provider.get_tracer("test").start_as_current_span("web request") as request:
        ok, bad = mod.traced.delay(1), mod.traced.delay(-1)
    assert ok.get(timeout=30) == 1
    with pytest.raises(ValueError, match="task -1 fails"):
        bad.get(timeout=30, propagate=True)

    sends = sent_ids(exporter, kq)
    assert len(sends) == 2
    the_trace = f"0x{request.get_span_context().trace_id:032x}"
    assert {trace_id(s) for s in sends.values()} == {the_trace}
    spans = worker_spans(path, lambda found: len(named(found, f"process {kq}")) == 2
                         and sum(s["attributes"].get("messaging.batch.message_count", 1)
                                 for s in named(found, f"settle {kq}")) >= 2)

    processes = {s["attributes"]["messaging.message.id"]: s for s in named(spans, f"process {kq}")}
    assert set(processes) == set(sends)
    for mid, process in processes.items():
        assert process["kind"] == "SpanKind.CONSUMER"
        assert process["context"]["trace_id"] == the_trace
        assert process["parent_id"] == span_id(sends[mid])  # run under the send span
        assert process["attributes"]["messaging.system"] == "belayq"
        assert process["attributes"]["messaging.destination.name"] == kq
        assert process["attributes"]["messaging.operation.type"] == "process"
    works = {s["name"]: s for s in spans if s["name"].startswith("work ")}
    assert set(works) == {"work 1", "work -1"}
    by_span = {s["context"]["span_id"]: s for s in processes.values()}
    assert {by_span[w["parent_id"]]["attributes"]["messaging.message.id"]
            for w in works.values()} == set(sends)  # the task's own spans, under its run

    failed = by_span[works["work -1"]["parent_id"]]
    assert failed["status"]["status_code"] == "ERROR"
    assert any(e["name"] == "exception" for e in failed["events"])
    succeeded = next(p for p in processes.values() if p is not failed)
    assert succeeded["status"]["status_code"] == "UNSET"

    linked = {link["context"]["span_id"] for s in named(spans, f"receive {kq}")
              for link in s["links"]}
    assert {span_id(s) for s in sends.values()} <= linked
    assert all(s["context"]["trace_id"] != the_trace for s in named(spans, f"receive {kq}"))


@pytest.mark.parametrize("producer_traced_by_celery", [False, True])
def test_celerys_own_instrumentation_runs_the_task_in_the_publishers_trace(
    producer_traced_by_celery: bool, workers: Callable[..., Worker],
    celery_env: dict[str, str], kq: str, tmp_path: Path,
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Celery's instrumentation in the worker makes the task's span (``run/<task>``), and
    belayq none of its own. Its parent is Celery's ``apply_async`` span when the producer
    is traced by Celery too (its headers are kept), else belayq's send span (the headers
    belayq gave the task)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    path = tmp_path / "worker-spans.jsonl"
    workers("-P", "solo", BQ_TRACE_FILE=str(path), BQ_TRACE_CELERY="1").wait_ready()
    tracer_provider, exporter = provider
    mod = app(celery_env)
    if producer_traced_by_celery:
        CeleryInstrumentor().instrument(tracer_provider=tracer_provider)
    try:
        with tracer_provider.get_tracer("test").start_as_current_span("web request") as request:
            result = mod.traced.delay(7)
        assert result.get(timeout=30) == 7
    finally:
        if producer_traced_by_celery:
            CeleryInstrumentor().uninstrument()

    the_trace = f"0x{request.get_span_context().trace_id:032x}"
    [send] = sent_ids(exporter, kq).values()
    spans = worker_spans(path, lambda found: bool(named(found, "run/worker_app.traced")))
    [run] = named(spans, "run/worker_app.traced")
    assert run["context"]["trace_id"] == the_trace
    if producer_traced_by_celery:
        [publish] = [s for s in exporter.get_finished_spans()
                     if s.name == "apply_async/worker_app.traced"]
        assert send.parent is not None and send.parent.span_id == publish.context.span_id
        assert run["parent_id"] == span_id(publish)
    else:
        assert run["parent_id"] == span_id(send)
    assert named(spans, f"process {kq}") == []  # Celery's span is the task's
    [work] = named(spans, "work 7")
    assert work["parent_id"] == run["context"]["span_id"]
