"""The exporter's metrics of an RQ queue, with a real ``rq worker`` (belayq_rq.Worker):
the oldest waiting job's age from its ``enqueued_at``, jobs counted as published at their
enqueue (once), queue wait and run time, failed runs and RQ's FailedJobRegistry."""

from __future__ import annotations

import time

import pytest
import redis

import belayq_rq
from belayq.discovery import list_queues, open_found
from belayq.metrics import QueueCollector
from tests.plugins.rq import jobs
from tests.plugins.rq.conftest import Workers
from tests.support import wait_for

parser = pytest.importorskip("prometheus_client.parser")
LAB = (("kind", "rq"), ("queue", "q1"))


def scrape(conn: redis.Redis) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(QueueCollector(
        lambda: [open_found(conn, f) for f in list_queues(conn, kind="rq")]))
    out = {}
    for family in parser.text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_rq_queue_metrics_with_a_real_worker(conn: redis.Redis, workers: Workers) -> None:
    q = belayq_rq.Queue("q1", connection=conn)
    ok = q.enqueue(jobs.add, 1, 2)
    failing = q.enqueue(jobs.fail)
    time.sleep(1.2)
    m = scrape(conn)
    assert 1.0 < m[("belayq_oldest_ready_age_seconds", LAB)] < 60  # from enqueued_at
    assert m[("belayq_published_total", LAB)] == 2  # counted at enqueue, not at claim
    assert m[("belayq_framework_failed", LAB)] == 0
    workers.start("q1", worker_class="tests.plugins.rq.jobs.FastWorker")
    wait_for(lambda: failing.get_status(refresh=True) == "failed"
             and ok.get_status(refresh=True) == "finished", 30, workers.logs)

    def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        m = scrape(conn)  # the worker's observations land with its next beat
        return m if m.get(("belayq_queue_wait_seconds_count", LAB)) == 2 else None

    m = wait_for(settled, 30, workers.logs)
    assert m[("belayq_published_total", LAB)] == 2
    assert m[("belayq_queue_wait_seconds_sum", LAB)] >= 2.0  # both waited over 1 s
    assert m[("belayq_acked_total", LAB)] == 2  # RQ's end of each run acks it
    assert m[("belayq_run_seconds_count", LAB)] == 2  # written by each work horse's ack
    assert m[("belayq_failed_total", LAB)] == 1
    assert m[("belayq_framework_failed", LAB)] == 1  # rq_jobs{status="failed"}
    assert ("belayq_oldest_ready_age_seconds", LAB) not in m
