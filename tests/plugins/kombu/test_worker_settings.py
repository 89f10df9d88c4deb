"""Newer Celery worker settings on belayq://, each with a real worker: they behave as on
the stock Redis transport. A setting older Celery versions lack is skipped there (the tox
envs of those versions list the skip)."""

from __future__ import annotations

import collections
import signal
import threading
import time
from collections.abc import Callable

import celery
import pytest
import redis

from tests.support import wait_for

from .conftest import Worker
from .test_celery_worker import Records, app, events
from .test_transport import stats

CELERY = tuple(int(x) for x in celery.__version__.split(".")[:2])


def needs(version: tuple[int, int], setting: str) -> None:
    if version > CELERY:
        pytest.skip(f"{setting} is new in Celery {version[0]}.{version[1]}")


class Peak:
    """The highest in-flight count of a queue, sampled every 50 ms in a thread."""

    def __init__(self, port: int, kq: str) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(port, kq), daemon=True)
        self._thread.start()

    def _run(self, port: int, kq: str) -> None:
        while not self._stop.wait(0.05):
            self.most = max(self.most, stats(port, kq)["in_flight"])

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def test_worker_disable_prefetch_takes_a_task_only_for_a_free_process(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    needs((5, 6), "worker_disable_prefetch")
    a = workers("--pool=prefork", "-c", "1", BQ_DISABLE_PREFETCH="1").wait_ready()
    mod = app(celery_env)
    peak = Peak(port, kq)
    results = [mod.sleeper.delay(i, 2.0) for i in range(6)]
    b = workers("--pool=prefork", "-c", "1", BQ_DISABLE_PREFETCH="1").wait_ready()
    for r in results:
        r.get(timeout=30)
    most = peak.stop()
    hosts = collections.Counter(r["host"] for r in records() if r["ev"] == "start")
    print(f"\nworker_disable_prefetch: at most {most} claimed at once; runs per worker {hosts}")
    assert most <= 2, most  # one per free process, never the prefetch of 4 per worker
    assert len(hosts) == 2, hosts  # the second worker found work the first did not hoard
    assert a.proc.poll() is None and b.proc.poll() is None


@pytest.mark.parametrize("native", ["0", "1"], ids=["held-by-the-worker", "native-delayed"])
def test_worker_eta_task_limit_bounds_what_the_worker_holds(
    native: str, workers: Callable[..., Worker], celery_env: dict[str, str], records: Records,
    port: int, kq: str
) -> None:
    needs((5, 6), "worker_eta_task_limit")
    # Prefetch 1 (-c 1, multiplier 1): each ETA task the worker holds raises Celery's
    # prefetch by one, up to the limit (Celery does not lower a larger initial prefetch).
    env = {"BQ_ETA_LIMIT": "2", "BQ_NATIVE": native}
    workers("--pool=solo", "-c", "1", "--prefetch-multiplier=1", **env).wait_ready()
    mod = app(celery_env, **env)
    results = [mod.sleeper.apply_async((i, 0.0), countdown=3.0) for i in range(5)]
    time.sleep(1.5)
    s = stats(port, kq)
    if native == "1":  # nothing to hold: they wait in Redis
        assert (s["in_flight"], s["delayed"]) == (0, 5), s
    else:  # the worker holds at most 2 ETA tasks (leased), the rest wait unclaimed
        assert 1 <= s["in_flight"] <= 2 and s["in_flight"] + s["ready"] == 5, s
    assert [r.get(timeout=30) for r in results] == list(range(5))
    assert events(records, "start") == collections.Counter(range(5))


def test_worker_soft_shutdown_timeout_requeues_a_running_task(
    workers: Callable[..., Worker], celery_env: dict[str, str], records: Records, port: int,
    kq: str
) -> None:
    # A cold shutdown (SIGQUIT) waits worker_soft_shutdown_timeout for running tasks, then
    # cancels the acks_late ones; their messages go back to the queue (uncounted) and
    # another worker runs them.
    needs((5, 5), "worker_soft_shutdown_timeout")
    first = workers("--pool=prefork", "-c", "1", BQ_SOFT_SHUTDOWN="2").wait_ready()
    mod = app(celery_env)
    result = mod.sleeper.delay(1, 8.0)
    wait_for(lambda: events(records, "start")[1] == 1, 30, "the task to start")
    first.proc.send_signal(signal.SIGQUIT)
    first.proc.wait(30)
    assert "Initiating Soft Shutdown" in first.text(), first.text()[-2000:]
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["dead"]) == (1, 0, 0), s
    workers("--pool=prefork", "-c", "1").wait_ready()
    assert result.get(timeout=30) == 1
    assert events(records, "start")[1] == 2 and events(records, "done")[1] == 1
    assert stats(port, kq).get("released", 0) >= 1


@pytest.mark.parametrize("reduction", ["1", "0"], ids=["reduction-on", "reduction-off"])
def test_worker_enable_prefetch_count_reduction_across_a_blip(
    reduction: str, workers: Callable[..., Worker], celery_env: dict[str, str],
    records: Records, port: int, kq: str
) -> None:
    # After a lost connection Celery (5.4+) lowers the prefetch to what is not running and
    # raises it again as tasks end; either way each task runs once and all are acked.
    needs((5, 4), "worker_enable_prefetch_count_reduction")
    w = workers("--pool=prefork", "-c", "2", BQ_PREFETCH_REDUCTION=reduction).wait_ready()
    mod = app(celery_env)
    results = [mod.sleeper.delay(i, 1.0) for i in range(10)]
    wait_for(lambda: sum(events(records, "start").values()) >= 2, 30, "two tasks to start")
    redis.Redis(port=port).client_kill_filter(_type="normal", skipme=True)
    assert [r.get(timeout=60) for r in results] == list(range(10))
    assert events(records, "start") == collections.Counter(range(10))
    wait_for(lambda: stats(port, kq)["in_flight"] == 0, 30, "every claim settled")
    if reduction == "1":
        # Celery picks the reduction from the transport's QoS semantics, which belayq://
        # inherits from the stock Redis transport: the same decision on both.
        import kombu

        with kombu.Connection(f"redis://127.0.0.1:{port}/0") as stock_conn, \
                kombu.Connection(f"belayq://127.0.0.1:{port}/0") as belayq_conn:
            stock_global = stock_conn.qos_semantics_matches_spec
            assert belayq_conn.qos_semantics_matches_spec == stock_global
        log = w.text()
        assert "Temporarily reducing the prefetch count" in log or (
            "Skipping prefetch count reduction" in log), log[-2000:]
