"""A worker's teardown stops the scheduler it started even when the stop request reaches the
scheduler's process before that process installed its own signal handlers (it then has the
worker's, inherited through the fork, which would take the request and let it run on)."""

from __future__ import annotations

import signal
import time
from typing import Any

import redis
from rq.scheduler import RQScheduler
from rq.worker import WorkerStatus

import belayq_rq
from belayq_rq.scheduler import STOP_WAIT_S


class SlowToStart(RQScheduler):
    """A scheduler whose process takes a second before it installs its signal handlers."""

    def work(self) -> None:
        time.sleep(1.0)
        super().work()


def test_a_scheduler_asked_to_stop_before_its_handlers_stops(conn: redis.Redis,
                                                              qname: str) -> None:
    worker = belayq_rq.SimpleWorker([qname], connection=conn)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    worker._install_signal_handlers()  # what a working worker has, and its fork inherits
    worker.set_state(WorkerStatus.BUSY)  # its handler then only notes the request
    try:
        worker.scheduler = SlowToStart([qname], connection=conn, interval=1)
        process: Any = worker.scheduler.start()
        time.sleep(0.2)  # forked, its handlers still the worker's
        started = time.monotonic()
        worker.stop_scheduler()
        took = time.monotonic() - started
        assert not process.is_alive()
        assert process.exitcode == 0, process.exitcode  # stopped on a later request, not killed
        assert took < STOP_WAIT_S
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
