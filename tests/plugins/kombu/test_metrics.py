"""The exporter's metrics of a Celery queue on belayq://, with a real ``celery worker``:
failed tasks, which Celery acks like the others, are counted apart (from the process that
ran them: the prefork pool's child, or the solo worker) and recorded with their tracebacks,
and the queue wait and run time of
the messages belayq:// published."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from belayq import failures
from belayq.discovery import list_queues, open_found
from belayq.metrics import QueueCollector
from tests.support import wait_for

from .conftest import Worker
from .test_celery_worker import app

parser = pytest.importorskip("prometheus_client.parser")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(conn: redis.Redis, kq: str) -> Samples:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(QueueCollector(lambda: [
        open_found(conn, f) for f in list_queues(conn, kind="kombu") if f.name == kq]))
    out = {}
    for family in parser.text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_failed_celery_tasks_are_counted_apart_from_the_acks(
    pool: str, workers: Callable[..., Worker], celery_env: dict[str, str], kq: str, port: int
) -> None:
    conn = redis.Redis(port=port)
    lab = (("kind", "kombu"), ("queue", kq))
    mod = app(celery_env)
    sent: list[Any] = [mod.boom.delay(i) for i in range(2)] + [mod.add.delay(1, 2)]
    time.sleep(1.0)
    m = scrape(conn, kq)
    assert 0.9 < m[("belayq_oldest_ready_age_seconds", lab)] < 60  # belayq:// stamped them
    w = workers(f"--pool={pool}", "-c", "1").wait_ready()
    assert sent[2].get(timeout=30) == 3
    for r in sent[:2]:
        with pytest.raises(ValueError):
            r.get(timeout=30)

    def settled() -> Samples | None:
        m = scrape(conn, kq)  # the main process's observations land with its next beat
        return m if m.get(("belayq_queue_wait_seconds_count", lab)) == 3 \
            and m.get(("belayq_run_seconds_count", lab)) == 3 else None

    m = wait_for(settled, 30, w.text)
    assert m[("belayq_acked_total", lab)] == 3  # Celery acked all three
    assert m[("belayq_failed_total", lab)] == 2
    # ... and each failed run is recorded with its traceback, for the dashboard
    assert m[("belayq_framework_failed", lab)] == 2
    [found] = [f for f in list_queues(conn, kind="kombu") if f.name == kq]
    q = open_found(conn, found)
    records = {r["id"]: r for r in failures.newest(q, 10)}
    assert set(records) == {r.id for r in sent[:2]}
    for i, r in enumerate(sent[:2]):
        rec = records[r.id]
        assert (rec["framework"], rec["task"], rec["args"]) == ("celery", mod.boom.name, f"({i},)")
        assert rec["reason"] == f"ValueError: task {i} always fails"
        assert "Traceback" in rec["exc_info"] and f"task {i} always fails" in rec["exc_info"]
        assert rec["message_id"] and re.fullmatch(r"\S+@\S+ pid \d+", rec["worker"])
        assert rec["retries"] == 0 and rec["failed_at_ms"] > 0
    assert m[("belayq_published_total", lab)] == 3
    assert m[("belayq_queue_wait_seconds_sum", lab)] >= 2.7  # each waited over a second
