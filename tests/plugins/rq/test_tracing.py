"""RQ jobs on belayq in the trace that enqueued them (belayq[otel]), through real RQ
workers: the SimpleWorker and the forking Worker (its work horse appends its spans to the
same file). Spans are read from the SDK's in-memory exporter in this process and from its
console exporter writing a JSON line per span to a file, for the horse's."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import rq
import rq.worker
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rq.exceptions import DuplicateJobError
from rq.job import Job

import belayq_rq
from belayq.errors import BelayqError
from belayq.keys import QueueKeys
from belayq.otel import BelayqInstrumentor
from belayq.registry import Registry
from tests.plugins.rq import jobs

Spans = list[dict[str, Any]]


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[TracerProvider, InMemorySpanExporter, Path]]:
    memory = InMemorySpanExporter()
    path = tmp_path / "spans.jsonl"
    out = path.open("a")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    BelayqInstrumentor().instrument(tracer_provider=provider)
    jobs.TRACER_PROVIDER = provider
    try:
        yield provider, memory, path
    finally:
        jobs.TRACER_PROVIDER = None
        BelayqInstrumentor().uninstrument()
        out.close()


def served(client: Any, name: str) -> None:
    """Record RQ queue ``name`` in belayq's registry, as a belayq worker on it does."""
    belayq_rq.Queue(name, connection=client).belayq()


def named(spans: Spans, name: str) -> Spans:
    return [s for s in spans if s["name"] == name]


@pytest.mark.parametrize("worker", [belayq_rq.SimpleWorker, belayq_rq.Worker],
                         ids=["SimpleWorker", "Worker"])
def test_a_job_runs_in_the_trace_that_enqueued_it(
    worker: type[rq.worker.BaseWorker], conn: Any,
    traced: tuple[TracerProvider, InMemorySpanExporter, Path],
) -> None:
    provider, memory, path = traced
    name = f"traced-{uuid.uuid4().hex[:8]}"
    served(conn, name)
    producer = rq.Queue(name, connection=conn)  # RQ's own producer: belayq traces it
    with provider.get_tracer("test").start_as_current_span("web request") as request:
        ok = producer.enqueue(jobs.traced, 1)
        bad = producer.enqueue(jobs.traced, -1)
        [many] = producer.enqueue_many([rq.Queue.prepare_data(jobs.traced, (2,))])
    worker([name], connection=conn).work(burst=True, logging_level="WARNING")
    assert ok.get_status(refresh=True) == "finished" and ok.return_value() == 1
    assert many.return_value() == 2
    assert bad.get_status(refresh=True) == "failed"

    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    the_trace = f"0x{request.get_span_context().trace_id:032x}"
    sends = {s["attributes"]["messaging.message.id"]: s for s in named(spans, f"send {name}")}
    assert set(sends) == {ok.id, bad.id, many.id}
    for send in sends.values():
        assert send["kind"] == "SpanKind.PRODUCER"
        assert send["context"]["trace_id"] == the_trace
        assert send["attributes"]["messaging.operation.type"] == "send"

    linked = {link["context"]["span_id"] for s in named(spans, f"receive {name}")
              for link in s["links"]}
    assert {s["context"]["span_id"] for s in sends.values()} <= linked

    processes = {s["attributes"]["messaging.message.id"]: s
                 for s in named(spans, f"process {name}")}
    assert set(processes) == set(sends)
    for job_id, process in processes.items():
        assert process["kind"] == "SpanKind.CONSUMER"
        assert process["parent_id"] == sends[job_id]["context"]["span_id"]
        assert process["attributes"]["belayq.delivery"] == 1
        assert process["attributes"]["rq.job.func_name"] == "tests.plugins.rq.jobs.traced"
    assert processes[bad.id]["status"]["status_code"] == "ERROR"
    assert "job -1 fails" in processes[bad.id]["status"]["description"]
    assert processes[ok.id]["status"]["status_code"] == "UNSET"
    works = {s["name"]: s for s in spans if s["name"].startswith("work ")}
    assert works["work 1"]["parent_id"] == processes[ok.id]["context"]["span_id"]
    assert works["work -1"]["parent_id"] == processes[bad.id]["context"]["span_id"]

    settles = named(spans, f"settle {name}")
    assert sum(s["attributes"].get("messaging.batch.message_count", 1) for s in settles) >= 2
    in_this_process = {s.name for s in memory.get_finished_spans()}
    assert {f"send {name}", f"receive {name}"} <= in_this_process


def test_tracing_off_leaves_rq_as_it_was() -> None:
    before = (rq.Queue._enqueue_job, rq.worker.Worker.perform_job)
    BelayqInstrumentor().instrument(tracer_provider=TracerProvider())
    assert (rq.Queue._enqueue_job, rq.worker.Worker.perform_job) != before
    BelayqInstrumentor().uninstrument()
    assert (rq.Queue._enqueue_job, rq.worker.Worker.perform_job) == before


def _contexts(client: Any, name: str) -> int:
    meta = QueueKeys.build(name, ready_key=f"rq:queue:{name}").meta
    return sum(1 for _ in client.hscan_iter(meta, match="* trace"))


@pytest.mark.parametrize("blocking", [False, True],
                         ids=["ConnectionPool", "BlockingConnectionPool"])
def test_traced_rq_enqueues_with_n_connections_and_n_threads_never_fail(
    conn: Any, rq_server: Any, blocking: bool,
    traced: tuple[TracerProvider, InMemorySpanExporter, Path],
) -> None:
    n, each = 4, 60
    pool_class = redis.BlockingConnectionPool if blocking else redis.ConnectionPool
    extra: dict[str, Any] = {"timeout": 2} if blocking else {}
    pool = pool_class(port=rq_server.port, max_connections=n, **extra)
    client = redis.Redis(connection_pool=pool)
    name = f"pool-{uuid.uuid4().hex[:8]}"
    served(conn, name)
    producer = rq.Queue(name, connection=client)
    failures: list[BaseException] = []
    start = threading.Barrier(n)

    def enqueue() -> None:
        start.wait()
        for i in range(each):
            try:
                producer.enqueue(jobs.traced, i)
            except Exception as exc:  # counted, not raised: every failure is shown
                failures.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert failures == []
        assert producer.count == n * each
        assert _contexts(conn, name) == n * each
        assert conn.keys("*trace:*") == []
    finally:
        pool.disconnect()


def test_an_rq_jobs_context_goes_with_it(
    conn: Any, traced: tuple[TracerProvider, InMemorySpanExporter, Path]
) -> None:
    name = f"gone-{uuid.uuid4().hex[:8]}"
    served(conn, name)
    producer = rq.Queue(name, connection=conn)
    done = producer.enqueue(jobs.traced, 1)
    cancelled = producer.enqueue(jobs.traced, 2)
    deleted = producer.enqueue(jobs.traced, 3)
    with conn.pipeline() as pipe:  # RQ's own transaction
        producer.enqueue_job(producer.create_job(jobs.traced, args=(4,)), pipeline=pipe)
        pipe.execute()
    assert _contexts(conn, name) == 4
    cancelled.cancel()
    deleted.delete()
    assert _contexts(conn, name) == 2
    belayq_rq.SimpleWorker([name], connection=conn).work(burst=True, logging_level="WARNING")
    assert done.get_status(refresh=True) == "finished"
    assert _contexts(conn, name) == 0


def test_a_stock_queue_no_belayq_worker_serves_keeps_no_context_in_redis(
    conn: Any, traced: tuple[TracerProvider, InMemorySpanExporter, Path]
) -> None:
    _, memory, _ = traced
    name = f"stock-{uuid.uuid4().hex[:8]}"
    stock = rq.Queue(name, connection=conn)
    for i in range(3):
        stock.enqueue(jobs.traced, i)
    rq.SimpleWorker([stock], connection=conn).work(burst=True, logging_level="WARNING")
    assert len(named([{"name": s.name} for s in memory.get_finished_spans()],
                     f"send {name}")) == 3
    keys = QueueKeys.build(name, ready_key=stock.key)
    assert conn.exists(keys.meta, keys.stats) == 0
    assert conn.keys(f"*{name}*:meta") == []


def test_a_refused_unique_duplicate_leaves_the_waiting_jobs_context(
    conn: Any, traced: tuple[TracerProvider, InMemorySpanExporter, Path]
) -> None:
    provider, _, _ = traced
    name = f"unique-{uuid.uuid4().hex[:8]}"
    queue = belayq_rq.Queue(name, connection=conn)
    meta = QueueKeys.build(name, ready_key=queue.key).meta
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("first"):
        queue.enqueue(jobs.traced, 1, job_id="J1", unique=True)
    kept = conn.hgetall(meta)
    assert _contexts(conn, name) == 1
    with tracer.start_as_current_span("second"), pytest.raises(DuplicateJobError):
        queue.enqueue(jobs.traced, 1, job_id="J1", unique=True)
    assert conn.hgetall(meta) == kept
    assert queue.count == 1


def test_rq_empty_on_a_belayq_queue_takes_the_jobs_contexts_with_them(
    conn: Any, traced: tuple[TracerProvider, InMemorySpanExporter, Path]
) -> None:
    name = f"emp-{uuid.uuid4().hex[:8]}"
    queue = belayq_rq.Queue(name, connection=conn)
    ids = [queue.enqueue(jobs.traced, i).id for i in range(5)]
    assert _contexts(conn, name) == 5
    assert queue.empty() == 5
    assert queue.count == 0 and _contexts(conn, name) == 0
    assert conn.exists(*(Job.key_for(i) for i in ids)) == 0
    assert queue.empty() == 0


def test_rq_delete_on_a_belayq_queue_leaves_no_key_of_it_nor_its_record(
    conn: Any, traced: tuple[TracerProvider, InMemorySpanExporter, Path]
) -> None:
    name = f"delq-{uuid.uuid4().hex[:8]}"
    queue = belayq_rq.Queue(name, connection=conn)
    for i in range(3):
        queue.enqueue(jobs.traced, i)
    belayq_rq.SimpleWorker([queue], connection=conn).work(burst=True, logging_level="WARNING")
    waiting = [queue.enqueue(jobs.traced, i).id for i in range(3)]
    assert Registry(conn).get("rq", name) is not None
    queue.delete(delete_jobs=True)
    assert conn.exists(*(Job.key_for(i) for i in waiting)) == 0
    own = [k for k in conn.keys(f"*{name}*") if b"finished" not in k and b"results" not in k]
    assert own == []
    assert Registry(conn).get("rq", name) is None
    assert name not in {q.name for q in rq.Queue.all(connection=conn)}


def test_rq_delete_while_a_job_is_claimed_raises_and_deletes_nothing(
    conn: Any, traced: tuple[TracerProvider, InMemorySpanExporter, Path]
) -> None:
    name = f"busy-{uuid.uuid4().hex[:8]}"
    queue = belayq_rq.Queue(name, connection=conn)
    for i in range(2):
        queue.enqueue(jobs.traced, i)
    got = belayq_rq.Queue.dequeue_any([queue], None, connection=conn)
    assert got is not None
    before = sorted(conn.keys(f"*{name}*"))
    with pytest.raises(BelayqError, match="claimed"):
        queue.delete(delete_jobs=True)
    assert sorted(conn.keys(f"*{name}*")) == before
    assert queue.count == 1 and _contexts(conn, name) == 2  # the claimed one keeps its own
    assert Registry(conn).get("rq", name) is not None
    queue.belayq().forget([belayq_rq.claims.claim_of(got[0]).delivery])  # type: ignore[union-attr]
