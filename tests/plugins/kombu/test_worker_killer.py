"""A task that kills its whole ``celery worker`` (main process and pool children at once)
the moment it starts: each of its runs counts toward ``max_deliveries`` in every pool, so
it ends in the dead-letter set instead of running again without limit, while the tasks
the dying workers had only prefetched finish without being counted."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import wait_for

from .conftest import Worker
from .test_celery_worker import app
from .test_transport import core_queue

Records = Callable[[], list[dict[str, Any]]]
MAX_DELIVERIES = 3


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pool", ["prefork", "solo", "threads"])
def test_a_task_that_kills_its_whole_worker_at_once_is_dead_lettered_after_max_deliveries(
    pool: str, workers: Callable[..., Worker], celery_env: dict[str, str], records: Records,
    port: int, kq: str
) -> None:
    env = {"BQ_MAX_DELIVERIES": str(MAX_DELIVERIES), "BQ_LEASE": "2", "BQ_SWEEP": "0.5"}
    mod = app(celery_env, **env)
    mod.kill_worker.delay(9)
    for i in range(3):
        mod.sleeper.delay(i, 0.1)
    core = core_queue(port, kq)
    for _ in range(MAX_DELIVERIES + 3):  # room to show runs that were never counted
        if core.stats()["dead"]:
            break
        w = workers(f"--pool={pool}", "-c", "1", "--prefetch-multiplier", "4", **env)
        wait_for(lambda w=w: w.proc.poll() is not None or core.stats()["dead"], 90,
                 lambda w=w: f"the worker to die or the dead letter: {core.stats()}\n"
                             f"{w.text()[-2000:]}")
        w.kill9()
    runs = collections.Counter(r["i"] for r in records() if r["ev"] == "start")[9]
    dead = core.dead_letters()
    assert dead, (f"not dead-lettered after {runs} runs (max_deliveries={MAX_DELIVERIES}): "
                  f"its runs were not counted; {core.stats()}")
    [letter] = dead
    assert (runs, letter.attempts) == (MAX_DELIVERIES, MAX_DELIVERIES), (runs, letter)
    assert f"max_deliveries={MAX_DELIVERIES}" in letter.reason, letter.reason
    # The tasks prefetched behind it lost no run to the kills.
    workers(f"--pool={pool}", "-c", "1").wait_ready()
    done = lambda: collections.Counter(r["i"] for r in records() if r["ev"] == "done")  # noqa: E731
    wait_for(lambda: set(done()) >= {0, 1, 2}, 60, lambda: f"the prefetched tasks: {done()}")
    wait_for(lambda: core.stats()["in_flight"] == 0, 30, lambda: f"the acks: {core.stats()}")
    s = core.stats()
    assert (s["ready"], s["in_flight"], s["dead"]) == (0, 0, 1), s


def test_a_start_report_that_cannot_reach_redis_lets_the_task_run(
    caplog: pytest.LogCaptureFixture
) -> None:
    """A pool child whose report fails logs it and returns (the task runs; the worker's
    main process reports the start on its next tick)."""
    import time

    from celery import Celery

    from belayq_kombu.starts import PoolChild

    app = Celery("unreachable", broker="belayq://127.0.0.1:1/0")
    child = PoolChild()
    started = time.monotonic()
    child.report(app, ["q", "id", "token"])
    assert time.monotonic() - started < 30
    assert "could not report the start" in caplog.text
    started = time.monotonic()
    for _ in range(10):  # the next tasks are not each delayed by a connection attempt
        child.report(app, ["q", "id", "token"])
    child.report(app, "not a claim")
    assert time.monotonic() - started < 0.5
