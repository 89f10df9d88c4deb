"""``celery inspect scheduled`` on belayq:// with real ``celery worker`` subprocesses: the
countdown and ETA tasks that wait in Redis are listed as Celery lists the ones a worker
holds, each once across the fleet (by the worker that leads the queue), also when each worker
is asked alone (Flower's worker pages) and after the leader is killed."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from tests.support import wait_for

from .conftest import Worker
from .test_celery_worker import app
from .test_transport import core_queue, stats


def node_of(w: Worker) -> str:
    return w.name.replace("%h", socket.gethostname())


def scheduled(mod: Any, *nodes: str) -> dict[str, list[dict[str, Any]]]:
    """One ``inspect scheduled`` broadcast (to ``nodes``, or to all): node -> entries."""
    got = mod.app.control.inspect(timeout=3.0, destination=list(nodes) or None).scheduled()
    return got or {}


def by_task(replies: dict[str, list[dict[str, Any]]]) -> dict[str, list[tuple[str, Any]]]:
    """Task id -> the (node, entry) pairs that list it."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for node, entries in replies.items():
        for e in entries:
            out.setdefault(e["request"]["id"], []).append((node, e))
    return out


def test_inspect_scheduled_lists_a_countdown_task_once_across_two_workers(
    workers: Callable[..., Worker], celery_env: dict[str, str], port: int, kq: str
) -> None:
    first = workers("--pool=solo", BQ_LEASE="3").wait_ready()
    second = workers("--pool=solo", BQ_LEASE="3").wait_ready()
    mod = app(celery_env, BQ_LEASE="3")
    eta = datetime.now(timezone.utc) + timedelta(seconds=60)
    countdown = mod.add.apply_async((2, 3), countdown=60)
    at_eta = mod.add.apply_async((4,), {"b": 5}, eta=eta)
    assert stats(port, kq)["delayed"] == 2  # in Redis, held by no worker

    replies = scheduled(mod)
    assert set(replies) == {node_of(first), node_of(second)}  # both answered
    listed = by_task(replies)
    assert set(listed) == {countdown.id, at_eta.id}
    assert all(len(pairs) == 1 for pairs in listed.values()), listed  # once, not per worker
    [(leader, entry)] = listed[at_eta.id]
    assert listed[countdown.id][0][0] == leader  # one worker answers for the queue
    # The shape Celery's own reply has for a task a worker holds for its ETA.
    assert entry == {
        "eta": eta.isoformat(), "priority": 6,
        "request": {
            "id": at_eta.id, "name": "worker_app.add", "args": [4], "kwargs": {"b": 5},
            "type": "worker_app.add", "hostname": leader, "time_start": None,
            "acknowledged": False, "worker_pid": None,
            "delivery_info": {"exchange": "", "routing_key": kq, "priority": 0,
                              "redelivered": False},
        },
    }
    due = datetime.fromisoformat(listed[countdown.id][0][1]["eta"]).timestamp()
    assert abs(due - (time.time() + 60)) < 5
    assert listed[countdown.id][0][1]["request"]["args"] == [2, 3]

    # Each worker asked alone, as Flower's worker pages ask: only the leader lists them.
    other = ({node_of(first), node_of(second)} - {leader}).pop()
    assert {e["request"]["id"] for e in scheduled(mod, leader)[leader]} == set(listed)
    assert scheduled(mod, other)[other] == []

    # The leader dies: once its lead lapses (a lease, 3 s) the other worker lists them.
    dead = first if node_of(first) == leader else second
    dead.kill9()
    wait_for(lambda: set(by_task(scheduled(mod, other))) == set(listed), 20,
             "the surviving worker to list the delayed tasks")
    assert stats(port, kq)["delayed"] == 2  # listing them moved nothing


def test_a_leader_that_stops_hands_the_listing_over_before_its_lead_expires(
    workers: Callable[..., Worker], celery_env: dict[str, str], port: int, kq: str
) -> None:
    # A 30 s lease: the others renew (and may take) the lead every 10 s. The leader's warm
    # shutdown gives its lead up, so the listing moves at the next renewal, not after 30 s.
    first = workers("--pool=solo", BQ_LEASE="30").wait_ready()
    second = workers("--pool=solo", BQ_LEASE="30").wait_ready()
    mod = app(celery_env, BQ_LEASE="30")
    task = mod.add.apply_async((1, 1), countdown=120)
    [(leader, _)] = by_task(scheduled(mod))[task.id]
    stopping = first if node_of(first) == leader else second
    other = node_of(second if stopping is first else first)
    stopping.stop()
    stopped = time.monotonic()
    wait_for(lambda: task.id in by_task(scheduled(mod, other)), 25,
             "the other worker to list the task")
    took = time.monotonic() - stopped
    print(f"\nlisting handed over {took:.1f} s after the leader stopped (lease 30 s)")
    assert took < 20, took


def test_an_idle_worker_writes_no_lead_while_nothing_is_delayed(
    workers: Callable[..., Worker], celery_env: dict[str, str], port: int, kq: str
) -> None:
    # A 1 s lease: the sweep would renew a lead every third of a second. With nothing
    # delayed it leads nothing and writes nothing; the first delayed task is listed at once.
    import redis

    workers("--pool=solo", BQ_LEASE="1").wait_ready()
    lead = core_queue(port, kq).keys.lead
    r = redis.Redis(port=port)
    tagged = f"*{{{kq}}}*"
    before = {k: r.dump(k) for k in r.keys(tagged)}
    with r.monitor() as m:
        seen: list[str] = []
        until = time.monotonic() + 3.5  # several lease periods, idle
        while time.monotonic() < until:
            seen.append(m.next_command()["command"])
    writes = [c for c in seen if lead in c and c.split()[0] in ("HSET", "PEXPIRE", "DEL")]
    assert writes == [] and not r.exists(lead)
    assert {k: r.dump(k) for k in r.keys(tagged)} == before
    assert any("lead" in c for c in seen)  # the sweep did ask (it ran, and found nothing)
    mod = app(celery_env, BQ_LEASE="1")
    task = mod.add.apply_async((1, 2), countdown=60)
    assert task.id in by_task(scheduled(mod))  # led from the request on: listed at once
    assert r.exists(lead)
