"""A forked child of a consumer process never waits on a lock its parent's threads held at
the instant of the fork (an RQ work horse forked while the lease keeper sends a beat)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from belayq import ReliableQueue


def _child_exit_code(pid: int, within_s: float) -> int | None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.parametrize("lock_name", ["_lock", "_fork_lock"])
def test_a_child_forked_while_a_thread_holds_the_pool_lock_still_talks_to_redis(
    q: ReliableQueue, lock_name: str
) -> None:
    q.publish(b"x")
    pool = q.client.connection_pool
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with getattr(pool, lock_name):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: its first command resets the pool in the new process
        code = 1
        try:
            signal.alarm(10)
            code = 0 if q.client.ping() and q.stats()["ready"] == 1 else 2
        finally:
            os._exit(code)
    try:
        code = _child_exit_code(pid, within_s=8)
    finally:
        release.set()
        holder.join(5)
    assert code == 0, "the child waited on the lock its parent's thread held at the fork"
