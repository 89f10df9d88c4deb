"""A worker's teardown waits a bounded time for its pub/sub thread (RQ's command channel),
even when that thread handles the UNSUBSCRIBE reply before the main thread asked it to stop:
it then polls for 60 s, and from redis-py 8.2 on ``PubSubWorkerThread.stop()`` joins it with
no timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
import redis.client

import belayq_rq
from belayq_rq.pubsub import STOP_WAIT_S
from tests.plugins.rq import jobs


def _stop_as_redis_py_8_2(self: Any, timeout: float | None = None) -> None:
    """redis-py 8.2's ``PubSubWorkerThread.stop``: it clears the flag, then joins."""
    self._running.clear()
    if threading.current_thread() is not self and self.is_alive():
        self.join(timeout)


class RepliesFirst(belayq_rq.SimpleWorker):
    """A worker whose pub/sub thread always handles the UNSUBSCRIBE reply before the main
    thread goes on (the interleaving a loaded machine produces now and then)."""

    def subscribe(self) -> None:
        super().subscribe()
        pubsub: Any = self.pubsub
        send = pubsub.unsubscribe

        def unsubscribe(*args: Any) -> Any:
            sent = send(*args)
            deadline = time.monotonic() + 5
            while pubsub.subscribed and time.monotonic() < deadline:
                time.sleep(0.01)
            return sent

        pubsub.unsubscribe = unsubscribe


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stop", ["installed", "redis-py 8.2"])
def test_teardown_waits_for_the_pubsub_thread_a_bounded_time(
    conn: redis.Redis, qname: str, stop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if stop == "redis-py 8.2":
        monkeypatch.setattr(redis.client.PubSubWorkerThread, "stop", _stop_as_redis_py_8_2)
    q = belayq_rq.Queue(qname, connection=conn)
    job = q.enqueue(jobs.add, 1, 2)
    worker = RepliesFirst([q], connection=conn)
    took: list[float] = []
    unsubscribe = worker.unsubscribe

    def timed() -> None:
        started = time.monotonic()
        unsubscribe()
        took.append(time.monotonic() - started)

    worker.unsubscribe = timed  # type: ignore[method-assign]
    assert worker.work(burst=True)  # a teardown that waits 60 s fails on the timeout
    assert job.get_status() == "finished"
    assert took and took[0] < STOP_WAIT_S * 0.8, took  # the thread ended at the reply
    thread: Any = worker.pubsub_thread
    thread.join(0.5)
    assert not thread.is_alive()  # no thread left polling for 60 s
