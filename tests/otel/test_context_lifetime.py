"""Where a traced message's context lives and how long: it is written by the publish that
stores the message, takes no connection of its own, and goes when the message goes (ack,
purge, drop, deleted dead letters); a context that cannot be kept leaves the message
published, untraced, and counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from belayq import ReliableQueue, ShardedQueue
from belayq.metrics import QueueCollector
from belayq.otel import BelayqInstrumentor, context_of
from tests.conftest import make_client


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


def _contexts(client: Any, q: ReliableQueue) -> int:
    """How many trace contexts the queue's meta hash holds."""
    return sum(1 for f in client.hscan_iter(q.keys.meta, match="* trace", count=5000))


def _strays(client: Any, q: ReliableQueue) -> list[str]:
    """Keys of the queue's hash tag that are none of its own keys (a context kept in a key
    of its own would be one)."""
    tag = q.keys.stats[: -len("stats")]
    found = {k.decode() for k in client.scan_iter(match=f"{tag}*", count=5000)}
    return sorted(found - set(q.keys.all_keys()))


def test_100k_traced_messages_acked_leave_no_context_behind(
    r: redis.Redis, make_queue: Any, spans: Any
) -> None:
    q = make_queue(r)
    n = 100_000
    q.publish_many([b"%d" % i for i in range(n)], batch=1000)
    assert _contexts(r, q) == n  # each message carries its context while it waits
    linked = 0
    while got := q.claim(count=1000, timeout=0):
        linked += sum(trace.get_current_span(context_of(d)).get_span_context().is_valid
                      for d in got)
        assert all(q.ack_many(got))
    assert linked == n  # every claim found its message's context
    assert q.stats()["ready"] == 0
    assert _contexts(r, q) == 0
    assert r.hlen(q.keys.meta) == 0
    assert _strays(r, q) == []


@pytest.mark.parametrize("inline", [False, True], ids=["ids", "payloads in the list"])
def test_purge_delete_dead_and_drop_leave_no_context_behind(
    r: redis.Redis, make_queue: Any, qname: str, spans: Any, inline: bool
) -> None:
    options: dict[str, Any] = {"max_deliveries": 1, "dead_letter_max": 5}
    if inline:
        options.update(ready_key=f"inline-{qname}", payload_in_list=True)
    q = make_queue(r, **options)
    q.publish_many([b"r%d" % i for i in range(50)])
    for i in range(20):
        q.publish(b"d%d" % i, delay_ms=60_000)
    assert _contexts(r, q) == 70
    q.purge(delayed=True)
    assert _contexts(r, q) == 0

    q.publish_many([b"x%d" % i for i in range(8)])
    got = q.claim(count=8, timeout=0)
    for d in got:
        assert q.nack(d, reason="boom") == "dead"
    assert q.stats()["dead"] == 5  # the 3 oldest dead letters went beyond the cap
    assert _contexts(r, q) == 5
    assert q.delete_dead(limit=100) == 5
    assert _contexts(r, q) == 0

    q.publish_many([b"y%d" % i for i in range(10)])
    q.publish(b"later", delay_ms=60_000)
    [d] = q.claim(timeout=0)
    assert q.nack(d, reason="boom") == "dead"
    assert _contexts(r, q) == 11
    assert q.drop()
    assert _contexts(r, q) == 0
    assert _strays(r, q) == []


@pytest.mark.parametrize("blocking", [False, True],
                         ids=["ConnectionPool", "BlockingConnectionPool"])
def test_a_traced_publisher_with_n_connections_and_n_threads_never_fails(
    redis_server: Any, make_queue: Any, spans: Any, blocking: bool
) -> None:
    n, each = 4, 150
    pool_class = redis.BlockingConnectionPool if blocking else redis.ConnectionPool
    extra: dict[str, Any] = {"timeout": 2} if blocking else {}
    pool = pool_class(port=redis_server.port, max_connections=n, **extra)
    client = redis.Redis(connection_pool=pool)
    q = make_queue(client)
    failures: list[BaseException] = []
    start = threading.Barrier(n)

    def publish() -> None:
        start.wait()
        for i in range(each):
            try:
                q.publish(b"m%d" % i)
            except Exception as exc:  # counted, not raised: every failure is shown
                failures.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert failures == []
        assert q.stats()["ready"] == n * each
        assert _contexts(client, q) == n * each
    finally:
        pool.disconnect()


class _Huge(TextMapPropagator):
    """Injects a header far beyond what a message may carry."""

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        carrier["traceparent"] = "00-" + "a" * 20_000

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context

    @property
    def fields(self) -> set[str]:
        return {"traceparent"}


def test_a_context_that_cannot_be_kept_publishes_untraced_and_counts(
    r: redis.Redis, make_queue: Any, spans: Any
) -> None:
    q = make_queue(r)
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(_Huge())
    try:
        q.publish(b"huge context")
        q.publish_many([b"a", b"b"])
    finally:
        propagate.set_global_textmap(before)
    # what the instrumentation never sends, handed to the script as it is
    for bad in ('{"traceparent":"' + "x" * 9000 + '"}', '{"tab":"\t"}', "{}",
                '{"x":"\u00e9"}'):
        q._publish_groups([q._publish_args(b"raw", 0, 0, None)], trace_context=bad)
    assert q.stats()["untraced"] == 7
    with pytest.raises(redis.ResponseError, match="context"):  # not one at all: a bad call
        q._publish_groups([q._publish_args(b"refused", 0, 0, None)], trace_context="x")
    assert q.stats()["published"] == 7
    got = q.claim(count=10, timeout=0)
    assert sorted(d.payload for d in got) == [b"a", b"b", b"huge context"] + [b"raw"] * 4
    assert _contexts(r, q) == 0
    assert all(q.ack_many(got))
    scraped = {
        (m.name, s.labels.get("queue")): s.value
        for m in QueueCollector(lambda: [q]).collect() for s in m.samples
        if s.name == "belayq_untraced_total"
    }
    assert scraped == {("belayq_untraced", q.name): 7.0}


@pytest.mark.parametrize("backend", ["redis62", "cluster"])
def test_the_context_rides_with_the_message_on_redis_62_and_a_cluster(
    request: pytest.FixtureRequest, make_queue: Any, spans: Any, backend: str
) -> None:
    client = make_client(request, backend)
    try:
        q = make_queue(client)
        q.publish(b"x")
        [d] = q.claim(timeout=0)
        [send] = _named(spans, "send ")
        [receive] = _named(spans, "receive ")
        assert [link.context.span_id for link in receive.links] == [send.context.span_id]
        assert q.ack(d)
        assert _contexts(client, q) == 0
        assert client.exists(q.keys.meta) == 0
    finally:
        client.close()


def test_a_sharded_queue_links_and_leaves_no_context(
    r: redis.Redis, qname: str, spans: Any
) -> None:
    q = ShardedQueue(r, qname, shards=3, keeper=False)
    try:
        q.publish_many([b"%d" % i for i in range(30)])
        got = [d for _ in range(30) for d in q.claim(timeout=0)]
        assert len(got) == 30
        assert sum(len(s.links) for s in _named(spans, "receive ")) == 30
        assert all(q.ack_many(got))
        for shard in q.shards:
            assert _contexts(r, shard) == 0
            assert _strays(r, shard) == []
    finally:
        q.close(release=False)
