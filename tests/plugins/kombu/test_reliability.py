"""What the transport guarantees beyond kombu's API: leases follow the consumer's life,
kill -9 at any point loses nothing, prefetch credit is respected without dropping replies."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import kombu
import redis

from tests.support import wait_for

from .test_transport import drain, publish, stats

LEASE = {"visibility_timeout": 1.0, "sweep_interval": 0.2}


def consumer_process(
    url: str, queue: str, *, prefetch: int, patch: str = ""
) -> subprocess.Popen[str]:
    """A child that consumes ``queue`` without acking, printing 'got <payload>' per message."""
    code = "\n".join([
        "import sys, socket, kombu, belayq_kombu",
        "from belayq_kombu import consume, transport",
        patch,
        textwrap.dedent(f"""
            q = kombu.Queue({queue!r}, routing_key={queue!r})
            def cb(body, message):
                print("got", body, flush=True)
            with kombu.Connection({url!r}, transport_options={LEASE!r}) as conn:
                with kombu.Consumer(conn, [q], callbacks=[cb], prefetch_count={prefetch}):
                    while True:
                        try:
                            conn.drain_events(timeout=1)
                        except socket.timeout:
                            pass
        """),
    ])
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def read_lines(proc: subprocess.Popen[str], n: int, timeout: float = 20) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while len(lines) < n:
        assert time.monotonic() < deadline, f"child printed only {lines}"
        line = proc.stdout.readline()
        assert line, f"child exited early: {lines}"
        lines.append(line.strip())
    return lines


def test_held_messages_keep_their_lease_while_the_consumer_lives(
    url: str, port: int, kq: str
) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"n": 1}])
    with kombu.Connection(url, transport_options=LEASE) as holder, \
            kombu.Connection(url, transport_options=LEASE) as rival:
        [m] = drain(holder, [q], 1, ack=False, prefetch_count=1)
        # three leases long: a rival consuming the same queue must not get it meanwhile
        stolen = drain(rival, [q], 1, timeout=3.5, prefetch_count=1)
        assert stolen == []
        s = stats(port, kq)
        assert (s["in_flight"], s.get("reclaimed", 0)) == (1, 0)
        m.ack()
    s = stats(port, kq)
    assert (s["in_flight"], s["acked"], s.get("stale_acks", 0)) == (0, 1, 0)


def test_kill9_of_a_consumer_holding_messages(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"n": i} for i in range(3)])
    child = consumer_process(url, kq, prefetch=3)
    try:
        assert len(read_lines(child, 3)) == 3
        assert stats(port, kq)["in_flight"] == 3
        child.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        child.wait(10)
        with kombu.Connection(url, transport_options=LEASE) as conn:
            got = drain(conn, [q], 3, timeout=15, prefetch_count=3)
        back = time.monotonic() - killed
    finally:
        child.kill()
    assert sorted(m.payload["n"] for m in got) == [0, 1, 2]
    assert all(m.delivery_info["redelivered"] for m in got)
    print(f"\nkill -9 of a consumer holding 3 messages: back after {back:.2f} s (lease 1 s)")
    assert back < 10


def test_kill9_between_the_blocking_claim_and_its_lease(url: str, port: int, kq: str) -> None:
    # The child dies the moment the claim's reply is readable: the entry has left the
    # ready list and sits in the landing zone with no lease yet. The sweep must bring it
    # back.
    patch = textwrap.dedent("""
        import os
        _send = consume.Waiter.send
        def send(self, *args):
            _send(self, *args)
            print("waiting", flush=True)
        consume.Waiter.send = send
        consume.Consume.on_reply = lambda self, w: os.kill(os.getpid(), 9)
    """)
    child = consumer_process(url, kq, prefetch=1, patch=patch)
    try:
        assert read_lines(child, 1) == ["waiting"]
        q = kombu.Queue(kq, routing_key=kq)
        publish(url, q, [{"gap": True}])
        child.wait(10)
        assert child.returncode == -signal.SIGKILL
        died = time.monotonic()
        s = stats(port, kq)
        assert (s["ready"], s["landing"], s["in_flight"]) == (0, 1, 0)  # in the gap
        with kombu.Connection(url, transport_options=LEASE) as conn:
            got = drain(conn, [q], 1, timeout=15, prefetch_count=1)
        back = time.monotonic() - died
    finally:
        child.kill()
    assert [m.payload for m in got] == [{"gap": True}]
    print(f"\nkill -9 between claim and lease: back after {back:.2f} s")
    assert stats(port, kq)["adopted"] >= 1


def test_a_reply_beyond_the_prefetch_credit_is_released_not_lost(
    url: str, port: int, kq: str
) -> None:
    # Two queues, prefetch 1: both blocking claims are pending when both queues get a
    # message. One is delivered; the other reply arrives with no credit left and must go
    # back to its queue, uncounted.
    qa, qb = (kombu.Queue(f"{kq}-{x}", routing_key=f"{kq}-{x}") for x in "ab")
    got: list[Any] = []
    with kombu.Connection(url) as conn:
        consumer = kombu.Consumer(conn, [qa, qb], callbacks=[lambda b, m: got.append(m)],
                                  prefetch_count=1)
        with consumer:
            cycle = conn.transport.cycle
            cycle.on_poll_start()  # both claims sent
            assert sum(1 for w in consumer.channel.waiters() if w.sent_at) == 2
            r = redis.Redis(port=port)
            with kombu.Connection(url) as pub:
                producer = pub.Producer()
                producer.publish({"q": "a"}, routing_key=qa.name, declare=[qa])
                producer.publish({"q": "b"}, routing_key=qb.name, declare=[qb])
            wait_for(lambda: r.llen(qa.name) == 0 and r.llen(qb.name) == 0, 5, "both taken")
            time.sleep(0.2)
            for _ in range(2):
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=1)
            assert len(got) == 1
            first = got[0].payload["q"]
            other = "b" if first == "a" else "a"
            s = stats(port, f"{kq}-{other}")
            assert (s["ready"], s["in_flight"], s["released"]) == (1, 0, 1)
            got[0].ack()
            wait_for(lambda: _drain(conn) or len(got) == 2, 5, "the released message")
            assert got[1].payload == {"q": other}
            assert not got[1].delivery_info.get("redelivered")
            got[1].ack()


def _drain(conn: kombu.Connection) -> bool:
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.2)
    return False


def test_consumer_cancel_hands_back_a_pending_claim_at_once(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    with kombu.Connection(url) as conn:
        consumer = kombu.Consumer(conn, [q], callbacks=[lambda b, m: None], prefetch_count=1)
        consumer.consume()
        conn.transport.cycle.on_poll_start()
        publish(url, q, [{"late": 1}])
        wait_for(lambda: redis.Redis(port=port).llen(kq) == 0, 5, "the claim to take it")
        started = time.monotonic()
        consumer.cancel()
        took = time.monotonic() - started
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"]) == (1, 0)
    assert took < 1.0, took


def test_ack_that_cannot_reach_redis_is_retried(url: str, port: int, kq: str) -> None:
    from belayq.errors import ConnectionLost

    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"a": 1}])
    with kombu.Connection(url) as conn:
        [m] = drain(conn, [q], 1, ack=False, prefetch_count=1)
        rq = conn.transport.queues[kq]
        real = rq.ack_many

        def down(deliveries: Any) -> list[bool]:
            raise ConnectionLost("simulated outage")

        rq.ack_many = down  # type: ignore[method-assign]
        m.ack()  # does not raise; queued for retry by the core's keeper
        assert rq.unsettled == 1 and stats(port, kq)["in_flight"] == 1
        assert len(rq.held) == 1  # still held, so the keeper extends it
        rq.ack_many = real  # type: ignore[method-assign]
        rq.heartbeat()  # what the keeper's next beat does
        assert rq.unsettled == 0
    s = stats(port, kq)
    assert (s["in_flight"], s["acked"]) == (0, 1)


def test_env_is_clean() -> None:
    assert "BELAYQ" not in "".join(os.environ)  # the tests need no environment switches


def test_a_kept_claim_whose_task_is_gone_is_released(url: str, port: int, kq: str) -> None:
    # What a closed channel keeps for a running task (a connection blip) must not stay
    # leased once no task runs it: here no Celery worker runs anything.
    from belayq_kombu import kept as claims

    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"kept": 1}])
    with kombu.Connection(url) as conn:
        [m] = drain(conn, [q], 1, ack=False, prefetch_count=1)
        kept = conn.transport.claims.kept
        kept.keep({m.delivery_tag: None}, 3600)
        claims.check_kept()
        assert stats(port, kq)["in_flight"] == 1  # seen once: not yet
        claims.check_kept()
        assert len(kept) == 0
        s = stats(port, kq)
        assert (s["ready"], s["in_flight"]) == (1, 0)
