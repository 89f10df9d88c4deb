"""Rolling migration between the stock redis:// transport and belayq://, both ways."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import kombu
import pytest
import redis

from .test_reliability import LEASE, consumer_process, read_lines
from .test_transport import drain, publish, stats


def test_belayq_consumes_what_stock_producers_publish(url: str, stock_url: str, port: int,
                                                       kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq, max_priority=9)
    publish(stock_url, q, [{"p": 0, "n": i} for i in range(3)])
    publish(stock_url, q, [{"p": 6}], priority=6)
    publish(stock_url, q, [{"p": 3}], priority=3)
    r = redis.Redis(port=port)
    assert (r.llen(kq), r.llen(f"{kq}\x06\x163"), r.llen(f"{kq}\x06\x166")) == (3, 1, 1)
    with kombu.Connection(url) as conn:
        got = [m.payload for m in drain(conn, [q], 5, prefetch_count=1)]
    assert got == [{"p": 0, "n": 0}, {"p": 0, "n": 1}, {"p": 0, "n": 2}, {"p": 3}, {"p": 6}]


def test_a_waiting_belayq_consumer_sees_stock_publishes_to_lower_priorities(
    url: str, stock_url: str, kq: str
) -> None:
    # A stock producer does not ring belayq's bell; the fleet's sweep does, within one
    # sweep period (0.2 s here).
    q = kombu.Queue(kq, routing_key=kq, max_priority=9)
    with kombu.Connection(url, transport_options=LEASE) as conn:
        got: list[object] = []
        with kombu.Consumer(conn, [q], callbacks=[lambda b, m: (got.append(b), m.ack())],
                            prefetch_count=1):
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.3)
            started = time.monotonic()
            publish(stock_url, q, [{"low": True}], priority=9)
            deadline = time.monotonic() + 5
            while not got and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.5)
            took = time.monotonic() - started
    assert got == [{"low": True}]
    print(f"\nstock publish to a lower priority list reached a waiting belayq consumer in "
          f"{took:.2f} s")


def test_stock_consumers_take_what_belayq_publishes(url: str, stock_url: str, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq, max_priority=9)
    publish(url, q, [{"n": i} for i in range(3)])
    publish(url, q, [{"n": 9}], priority=9)
    with kombu.Connection(stock_url) as conn:
        got = [m.payload for m in drain(conn, [q], 4, prefetch_count=1)]
    assert got == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 9}]


def test_stock_unacked_messages_are_adopted(url: str, stock_url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(stock_url, q, [{"n": i} for i in range(3)])
    # A stock worker takes all three and dies without acking (no restore at shutdown).
    with kombu.Connection(stock_url) as conn:
        held = drain(conn, [q], 3, ack=False, prefetch_count=3)
        assert len(held) == 3
        held[0].channel.do_restore = False
    r = redis.Redis(port=port)
    assert (r.hlen("unacked"), r.llen(kq)) == (3, 0)
    time.sleep(1.2)
    opts = {**LEASE, "stock_unacked_timeout": 1}
    with kombu.Connection(url, transport_options=opts) as conn:
        got = drain(conn, [q], 3, prefetch_count=3)
    assert sorted(m.payload["n"] for m in got) == [0, 1, 2]
    assert (r.hlen("unacked"), r.zcard("unacked_index")) == (0, 0)
    assert stats(port, kq)["acked"] == 3


def test_rollback_returns_what_dead_belayq_workers_held(url: str, stock_url: str, port: int,
                                                         kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"n": i} for i in range(4)])
    child = consumer_process(url, kq, prefetch=2)  # takes two, then dies holding them
    try:
        assert len(read_lines(child, 2)) == 2
    finally:
        child.kill()
        child.wait(10)
    with kombu.Connection(url) as conn:  # one more is dead-lettered
        q2 = conn.SimpleQueue(kq)
        q2.get(timeout=5).reject(requeue=False)
        q2.close()
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["dead"]) == (1, 2, 1)
    out = subprocess.run(
        [sys.executable, "-m", "belayq_kombu", "rollback", "--url", url, "--queue", kq, "--dead",
         "-o", "visibility_timeout=1"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 ready in kombu's lists (0 of them tasks whose countdown or ETA had not come), " \
        "0 still leased, 1 dead letters replayed" in out.stdout
    with kombu.Connection(stock_url) as conn:
        got = drain(conn, [q], 4, prefetch_count=1)
    assert sorted(m.payload["n"] for m in got) == [0, 1, 2, 3]


def test_rollback_returns_countdown_tasks_to_kombus_lists(
    url: str, stock_url: str, port: int, kq: str
) -> None:
    from celery import Celery

    app = Celery("producer", broker=url)
    app.send_task("proj.later", (1,), queue=kq, countdown=3600)
    app.send_task("proj.now", (2,), queue=kq)
    assert (stats(port, kq)["delayed"], redis.Redis(port=port).llen(kq)) == (1, 1)
    out = subprocess.run(
        [sys.executable, "-m", "belayq_kombu", "rollback", "--url", url, "--queue", kq],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr  # nothing is leased: no worker runs
    assert "2 ready in kombu's lists (1 of them tasks whose countdown or ETA had not come), " \
        "0 still leased" in out.stdout
    with kombu.Connection(stock_url) as conn:  # a stock worker takes both; it holds the ETA
        got = drain(conn, [kombu.Queue(kq, routing_key=kq)], 2, prefetch_count=2)
    assert sorted(m.headers["task"] for m in got) == ["proj.later", "proj.now"]
    assert stats(port, kq)["delayed"] == 0


def test_rollback_refuses_while_a_worker_still_holds_leases(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"n": 1}])
    with kombu.Connection(url, transport_options=LEASE) as conn:
        [m] = drain(conn, [q], 1, ack=False, prefetch_count=1)
        out = subprocess.run(
            [sys.executable, "-m", "belayq_kombu", "rollback", "--url", url, "--queue", kq,
             "--wait", "2"],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 1, out.stdout + out.stderr
        assert "stop every belayq worker" in out.stderr
        m.ack()


def test_by_default_belayq_rings_its_bell_in_the_first_list(url: str, port: int,
                                                             kq: str) -> None:
    # Why the option below exists: the wake-up entry is not a kombu message.
    q = kombu.Queue(kq, routing_key=kq, max_priority=9)
    publish(url, q, [{"n": 9}], priority=9)
    [entry] = redis.Redis(port=port).lrange(kq, 0, -1)
    with pytest.raises(ValueError):
        json.loads(entry)


def test_a_mixed_fleet_stock_consumer_only_ever_sees_kombu_messages(
    url: str, stock_url: str, port: int, kq: str
) -> None:
    """priority_bell=False: the first list only ever holds kombu messages, on publish and on
    every way a message returns to a lower list (requeue, release on close; lease expiry is
    the core's test_bell_off_*), and belayq
    consumers still find lower-priority work."""
    q = kombu.Queue(kq, routing_key=kq, max_priority=9)
    options = {**LEASE, "priority_bell": False}
    r = redis.Redis(port=port)

    def first_list_is_clean() -> None:
        for entry in r.lrange(kq, 0, -1):
            json.loads(entry)  # what a stock consumer does with every entry it pops

    with kombu.Connection(url, transport_options=options) as conn:
        conn.Producer().publish({"n": 9}, exchange=q.exchange, routing_key=q.routing_key,
                                declare=[q], priority=9)
        first_list_is_clean()
        [m] = drain(conn, [q], 1, ack=False, prefetch_count=1)
        m.requeue()
        first_list_is_clean()
        [m] = drain(conn, [q], 1, ack=False, prefetch_count=1)
        assert m.payload == {"n": 9}
    first_list_is_clean()  # closing released the unacked message to its own list
    with kombu.Connection(url, transport_options=options) as conn:
        got = drain(conn, [q], 1, prefetch_count=1)
        first_list_is_clean()
    assert [g.payload for g in got] == [{"n": 9}]
    with kombu.Connection(stock_url) as conn:
        assert drain(conn, [q], 1, timeout=0.5) == []  # nothing left, and nothing undecodable
