"""Dramatiq's Prometheus middleware in a real ``dramatiq`` worker on belayq_dramatiq.Broker
and, for comparison, stock RedisBroker: its exposition server scraped over HTTP after
messages that succeed, fail (with a retry) and wait (a delayed one)."""

from __future__ import annotations

import socket
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import dramatiq
import redis
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from belayq_dramatiq import Broker
from tests.plugins.dramatiq.conftest import Workers, entries
from tests.support import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def send(broker: dramatiq.Broker, actor: str, *args: Any, delay: int | None = None) -> None:
    broker.enqueue(dramatiq.Message(queue_name="default", actor_name=actor, args=args,
                                    kwargs={}, options={}), delay=delay)


def samples(port: int) -> list[Sample] | None:
    """The exposition server's samples, or None while it is not up yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def totals(got: list[Sample], name: str, by: str = "actor_name") -> dict[str, float]:
    """``{label value: sum}`` of one sample name, summed over the other labels (the queue,
    and the worker's pid of a gauge kept per process)."""
    out: dict[str, float] = defaultdict(float)
    for sample in got:
        if sample.name == name:
            out[sample.labels[by]] += sample.value
    return dict(out)


def test_prometheus_counts_runs_errors_retries_and_durations(
    producer: dramatiq.Broker, stock: bool, workers: Workers, conn: redis.Redis,
    tmp_path: Path,
) -> None:
    port = free_port()
    worker = workers.start(stock=stock, threads=2, dq_prometheus="1", environ={
        "dramatiq_prom_host": "127.0.0.1", "dramatiq_prom_port": str(port),
        "dramatiq_prom_db": str(tmp_path / "prometheus")})
    worker.wait_ready()
    for i in range(5):
        send(producer, "mark", f"m{i}")
    for i in range(2):
        send(producer, "fails", f"f{i}")  # runs twice (one retry), then dead-lettered
    send(producer, "mark", "later", delay=60_000)
    for what, count in (("done", 5), ("failed", 4)):
        wait_for(lambda what=what, count=count: len(entries(conn, what)) >= count, 30,
                 lambda what=what: f"{what}: {entries(conn, what)}; queue "
                                   f"{conn.lrange('dramatiq:default', 0, -1)}\n{worker.output()}")
    # the last runs' settles (and their samples) follow their records
    got = wait_for(
        lambda: (g := samples(port))
        and totals(g, "dramatiq_message_rejects_total").get("fails") == 2 and g,
        30, lambda: (samples(port), worker.output()))

    def m(name: str) -> dict[str, float]:
        return totals(got, name)

    assert m("dramatiq_messages_total") == {"mark": 5, "fails": 4}
    assert m("dramatiq_message_errors_total") == {"fails": 4}
    assert m("dramatiq_message_rejects_total") == {"fails": 2}
    assert m("dramatiq_messages_inprogress") == {"mark": 0, "fails": 0}
    assert m("dramatiq_message_duration_milliseconds_count") == {"mark": 5, "fails": 4}
    retries = totals(got, "dramatiq_message_retries_total", by="queue_name")
    if stock:
        # stock counts each retry twice: when Retries puts it on default.DQ, and again when
        # the worker moves it, due, back to default (the copy keeps its "retries" option)
        assert retries == {"default.DQ": 2, "default": 2}
        # the delayed message sits in the worker's memory, claimed from default.DQ
        assert m("dramatiq_delayed_messages_inprogress") == {"mark": 1, "fails": 0}
        assert conn.llen("dramatiq:default.DQ") == 0
        [acks] = conn.keys("dramatiq:__acks__.*.default.DQ")
        assert conn.scard(acks) == 1
    else:
        # each retry once, under the queue it runs on
        assert retries == {"default": 2}
        # delayed messages wait in Redis; a worker never holds one in memory
        assert m("dramatiq_delayed_messages_inprogress") == {}
        assert isinstance(producer, Broker)
        stats = producer.store("default").core.stats()
        assert (stats["delayed"], stats["in_flight"], stats["ready"]) == (1, 0, 0), stats
        # acked: the 5 marks and the fails' first runs (their retries are new messages)
        assert (stats["acked"], stats["dead"], stats["promoted"]) == (7, 2, 2), stats
