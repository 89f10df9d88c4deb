"""What the transport reads of a running Celery worker (belayq_kombu/celery_state.py), on
the worker's own state module with requests and billiard jobs as a pool leaves them.

The real-worker proof of the blip path is the chaos run (benchmarks/chaos, client-kill): the
window in which billiard has written a task to a child that has not accepted it is a few
milliseconds wide, and no test can hold it open.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from billiard.pool import ApplyResult
from celery.worker import state

from belayq_kombu import celery_state


class Message:
    def __init__(self, tag: str) -> None:
        self.delivery_tag = tag


class Request:
    """What celery_state reads of a Celery request: its message and its pool job."""

    def __init__(self, tag: str, job: Any = None) -> None:
        self._message = Message(tag)
        self.job = job  # held here: Celery itself keeps a weak reference
        self._apply_result = weakref.ref(job) if job is not None else None


def job(cache: dict[int, Any], *, written: bool, accepted: bool) -> ApplyResult:
    j = ApplyResult(cache, None)
    if written:
        j._write_to = object()  # the child process billiard writes it to
    j._accepted = accepted
    return j


@pytest.fixture
def worker_state() -> Iterator[None]:
    saved = (set(state.active_requests), set(state.reserved_requests))
    state.active_requests.clear()
    state.reserved_requests.clear()
    yield
    state.active_requests.clear()
    state.reserved_requests.clear()
    state.active_requests.update(saved[0])
    state.reserved_requests.update(saved[1])


def test_the_pool_holds_running_and_written_tasks_only(worker_state: None) -> None:
    cache: dict[int, Any] = {}
    running = Request("running", job(cache, written=True, accepted=True))
    written = Request("written", job(cache, written=True, accepted=False))
    buffered = Request("buffered", job(cache, written=False, accepted=False))
    waiting = Request("waiting")  # not handed to the pool at all (semaphore, ETA timer)
    state.active_requests.add(running)
    state.reserved_requests.update([running, written, buffered, waiting])
    assert set(celery_state.in_pool_requests()) == {"running", "written"}
    assert celery_state.running_tags() == {"running"}  # only started runs count as attempts


def test_a_written_job_is_kept_by_billiards_flush_and_reports_its_end(worker_state: None) -> None:
    cache: dict[int, Any] = {}
    written = Request("written", job(cache, written=True, accepted=False))
    buffered = Request("buffered", job(cache, written=False, accepted=False))
    assert celery_state.keep_written_jobs([written, buffered]) == 1
    # billiard's AsynPool.flush() drops every job not accepted from its cache; the marked
    # one stays, so the child's result reaches it and Celery's callbacks (the ack) run.
    survivors = {k: j for k, j in cache.items() if j._accepted}
    assert list(survivors.values()) == [written.job]
    assert celery_state.job_outcome(written.job) is None  # still running
    written.job._set(0, (True, 42))
    assert celery_state.job_outcome(written.job) is True
    failed = job(cache, written=True, accepted=True)
    failed._set(0, (False, RuntimeError("boom")))
    assert celery_state.job_outcome(failed) is False


class Child:
    """What celery_state reads of a billiard pool process."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def _is_alive(self) -> bool:
        return self.alive


def test_a_kept_job_whose_child_died_before_taking_it_has_failed(worker_state: None) -> None:
    # Written to a busy child's pipe and kept by a blip (marked accepted): if that child
    # dies, billiard neither reports the job lost nor writes it elsewhere.
    cache: dict[int, Any] = {}
    written = Request("written", job(cache, written=True, accepted=False))
    child = written.job._write_to = Child(alive=True)
    assert celery_state.keep_written_jobs([written]) == 1
    assert celery_state.job_outcome(written.job) is None  # waits for the busy child
    child.alive = False
    written.job._write_to = Child(alive=True)  # billiard began it again on a new child
    assert celery_state.job_outcome(written.job) is False  # never runs: release it
    taken = job(cache, written=True, accepted=True)
    taken._write_to, taken._worker_pid = Child(alive=False), 4242
    assert celery_state.job_outcome(taken) is None  # a child took it: billiard reports it


def test_a_revoke_goes_to_the_workers_own_set(worker_state: None) -> None:
    assert celery_state.remember_revoked({"t-revoked"})
    assert "t-revoked" in state.revoked
    state.revoked.discard("t-revoked")
