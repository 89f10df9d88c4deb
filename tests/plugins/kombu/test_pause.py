"""A real ``celery worker`` on a paused queue: it is handed nothing while tasks are
published, the task it runs keeps its lease (extended past it) and is acked, the claims
name the worker's host and pid, and a resume starts the waiting tasks at once."""

from __future__ import annotations

import collections
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import redis

from belayq.cli import main
from belayq.discovery import find, open_found
from tests.support import wait_for

from .conftest import Worker
from .test_celery_worker import app

Records = Callable[[], list[dict[str, Any]]]


def starts(records: Records) -> collections.Counter[Any]:
    return collections.Counter(r["i"] for r in records() if r["ev"] == "start")


def test_a_paused_queue_hands_a_celery_worker_nothing_until_resumed(
    workers: Callable[..., Worker], celery_env: dict[str, str], kq: str, port: int,
    records: Records, capsys: Any,
) -> None:
    env = {"BQ_LEASE": "2"}  # the running task (5 s) outlives two leases: the keeper extends
    w = workers("--pool=prefork", "-c", "2", **env).wait_ready()
    mod = app(celery_env, **env)
    mod.sleeper.delay(0, 5.0)
    wait_for(lambda: starts(records)[0], 30, "task 0 to start")
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis(port=port)
    q = open_found(client, find(client, kq, "kombu"))
    [lease] = q.in_flight()
    assert (lease.host, lease.pid) == (socket.gethostname(), w.proc.pid), lease

    assert main(["pause", "--url", url, kq, "--kind", "kombu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is True
    for i in (1, 2, 3):
        mod.sleeper.delay(i, 0.1)  # publishing goes on
    wait_for(lambda: [r for r in records() if r["ev"] == "done" and r["i"] == 0], 30,
             "task 0 to finish (its lease extended, then acked)")
    time.sleep(2.5)  # more than a lease and several sweeps: nothing else may start
    assert set(starts(records)) == {0}, w.text()[-3000:]
    stats = q.stats()
    assert stats["paused"] == 1 and stats["ready"] == 3 and stats["in_flight"] == 0, stats
    assert starts(records)[0] == 1  # extended, never redelivered

    resumed = time.monotonic()
    assert main(["resume", "--url", url, kq, "--kind", "kombu"]) == 0
    wait_for(lambda: {1, 2, 3} <= set(starts(records)), 30, "the waiting tasks to start")
    took = time.monotonic() - resumed
    print(f"\ncelery worker: the first waiting task started {took:.2f} s after the resume")
    assert took < 5, took  # generous: a shared 2-core box; a blocked claim is woken
    client.close()
