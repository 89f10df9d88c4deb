"""The belayq:// kombu transport through kombu's own API, on a real redis-server."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import Any

import kombu
import pytest
import redis
from kombu.transport import TRANSPORT_ALIASES

import belayq_kombu
from belayq_kombu.transport import Transport
from tests.support import wait_for


def drain(conn: kombu.Connection, queues: list[kombu.Queue], n: int, *, ack: bool = True,
          timeout: float = 5, **consumer: Any) -> list[Any]:
    """Consume ``n`` messages; returns the kombu messages (acked unless ``ack`` is False)."""
    got: list[Any] = []

    def cb(body: Any, message: Any) -> None:
        got.append(message)
        if ack:
            message.ack()

    accept = ["json", "pickle", "text/plain"]
    with kombu.Consumer(conn, queues, callbacks=[cb], accept=accept, **consumer):
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.5)
    return got


def publish(url: str, q: kombu.Queue, bodies: list[Any], **kw: Any) -> None:
    with kombu.Connection(url) as conn:
        producer = conn.Producer()
        for b in bodies:
            producer.publish(b, exchange=q.exchange, routing_key=q.routing_key, declare=[q], **kw)


def core_queue(port: int, name: str) -> Any:
    """The core queue behind kombu queue ``name`` (kombu's default priority steps)."""
    from belayq import ReliableQueue

    steps = (0, 3, 6, 9)
    levels = [name] + [f"{name}\x06\x16{s}" for s in steps[1:]]
    return ReliableQueue(redis.Redis(port=port), name, ready_key=levels[0],
                         level_keys=levels[1:], priority_steps=steps, payload_in_list=True,
                         keeper=False)


def stats(port: int, name: str) -> dict[str, int]:
    return dict(core_queue(port, name).stats())


def test_publish_consume_ack(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"i": i} for i in range(10)])
    with kombu.Connection(url) as conn:
        got = drain(conn, [q], 10, prefetch_count=3)
    assert [m.payload["i"] for m in got] == list(range(10))
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["acked"]) == (0, 0, 10)
    assert len({m.delivery_tag for m in got}) == 10


def test_url_scheme_is_registered_and_class_path_works(url: str, port: int, kq: str) -> None:
    assert TRANSPORT_ALIASES["belayq"] == "belayq_kombu.transport:Transport"
    assert TRANSPORT_ALIASES["belayqs"] == "belayq_kombu.transport:SSLTransport"
    assert isinstance(kombu.Connection(url).transport, Transport)
    for path in ("belayq_kombu:Transport", "belayq_kombu.transport:Transport"):
        conn = kombu.Connection(f"redis://127.0.0.1:{port}/0", transport=path)
        assert isinstance(conn.transport, Transport)
        assert conn.transport.driver_type == "redis"
    # broker_transport works in a process that never imports belayq_kombu itself:
    code = (
        "import sys, kombu\n"
        f"c = kombu.Connection('redis://127.0.0.1:{port}/0', transport='belayq_kombu:Transport')\n"
        f"q = c.SimpleQueue('{kq}'); q.put({{'x': 1}}); m = q.get(timeout=5); m.ack()\n"
        "print(type(c.transport).__module__, m.payload)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "belayq_kombu.transport {'x': 1}"
    assert stats(port, kq)["acked"] == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"visibilty_timeout": 5}, "did you mean 'visibility_timeout'"),
        ({"no_such_thing": 1}, "unknown belayq:// transport option 'no_such_thing'"),
        ({"visibility_timeout": -1}, "'visibility_timeout' must be a number of seconds"),
        ({"max_deliveries": 0}, "'max_deliveries' must be an int >= 1"),
        ({"ack_emulation": False}, "belayq always tracks unacked messages"),
        ({"master_name": "mymaster"}, "'master_name' is for Redis Sentinel: use a belayq"),
        ({"sentinel_fanout_compat": True}, "upgrade the stock workers to kombu >= 5.4 first"),
        ({"wait_replicas": -1}, "'wait_replicas' must be an int >= 0"),
        ({"wait_aof": "yes"}, "'wait_aof' must be None, True or False"),
        ({"reauth_check_interval": 10}, "remove reauth_check_interval"),
        ({"priority_steps": [0, 5, 3]}, "priority_steps must be strictly increasing"),
        ({"visibility_timeout": 1, "lease_heartbeat_interval": 2}, "must be shorter than lease_ms"),
        ({"priority_bell": "no"}, "'priority_bell' must be True or False"),
    ],
)
def test_bad_options_give_one_clear_error(url: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        kombu.Connection(url, transport_options=options).connect()


def test_stock_option_names_are_accepted(url: str, kq: str) -> None:
    options = {
        "visibility_timeout": 30, "global_keyprefix": "pfx_", "priority_steps": [0, 5],
        "socket_timeout": 5, "socket_connect_timeout": 5, "health_check_interval": 10,
        "max_connections": 20, "queue_order_strategy": "round_robin", "fanout_prefix": True,
        "unacked_restore_interval": 10, "polling_interval": 0.5, "max_retries": 3,
        "max_deliveries": 3, "sweep_interval": 0.5, "dead_letter_rejected": False,
    }
    with kombu.Connection(url, transport_options=options) as conn:
        q = conn.SimpleQueue(kq)
        q.put({"a": 1}, priority=7)
        m = q.get(timeout=5)
        assert m.payload == {"a": 1}
        m.ack()
        client = conn.default_channel.core_client
        assert client.exists(f"pfx_{kq}\x06\x165") == 0  # the level list, empty again
        q.close()


def test_priorities_follow_the_stock_order(url: str, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq, max_priority=9)
    sent = [(9, "nine"), (0, "zero-a"), (5, "five"), (3, "three"), (0, "zero-b"), (6, "six")]
    with kombu.Connection(url) as conn:
        producer = conn.Producer()
        for prio, body in sent:
            producer.publish(body, routing_key=kq, declare=[q], priority=prio)
        got = [m.payload for m in drain(conn, [q], len(sent), prefetch_count=1)]
    # lower number first (the stock Redis transport's order); steps 0,3,6,9; FIFO within one
    assert got == ["zero-a", "zero-b", "five", "three", "six", "nine"]


def test_several_queues_per_consumer(url: str, kq: str) -> None:
    queues = [kombu.Queue(f"{kq}-{i}", routing_key=f"{kq}-{i}") for i in range(3)]
    for i, q in enumerate(queues):
        publish(url, q, [f"{i}-{j}" for j in range(4)])
    with kombu.Connection(url) as conn:
        got = drain(conn, queues, 12, prefetch_count=2)
    assert sorted(m.payload for m in got) == sorted(f"{i}-{j}" for i in range(3) for j in range(4))


def test_reject_requeue_counts_deliveries_then_dead_letters(url: str, port: int, kq: str) -> None:
    opts = {"max_deliveries": 3}
    with kombu.Connection(url, transport_options=opts) as conn:
        q = conn.SimpleQueue(kq)
        q.put({"poison": True})
        seen = []
        for _ in range(3):
            m = q.get(timeout=5)
            seen.append(m.delivery_info.get("redelivered", False))
            m.reject(requeue=True)
        with pytest.raises(q.Empty):
            q.get(timeout=1.5)
        q.close()
    assert seen == [False, True, True]
    [dead] = stats_dead(port, kq)
    assert dead.reason.startswith("rejected with requeue") and "max_deliveries=3" in dead.reason
    assert dead.deliveries == 3
    # documented replay command puts it back
    out = subprocess.run(
        [sys.executable, "-m", "belayq_kombu", "replay", "--url", url, "--queue", kq],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "replayed 1" in out.stdout
    with kombu.Connection(url) as conn:
        q = conn.SimpleQueue(kq)
        m = q.get(timeout=5)
        assert m.payload == {"poison": True}
        m.ack()
        q.close()


def stats_dead(port: int, name: str) -> list[Any]:
    return list(core_queue(port, name).dead_letters())


def test_reject_without_requeue_dead_letters_with_the_reason(url: str, port: int, kq: str) -> None:
    with kombu.Connection(url) as conn:
        q = conn.SimpleQueue(kq)
        q.put("unwanted")
        q.get(timeout=5).reject(requeue=False)
        with pytest.raises(q.Empty):
            q.get(timeout=0.5)
        q.close()
    [dead] = stats_dead(port, kq)
    assert dead.reason == "rejected without requeue"
    assert b"dW53YW50ZWQ=" in dead.payload  # base64 of the body, in the stock envelope


def test_basic_recover_hands_back_uncounted(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, ["a", "b"])
    with kombu.Connection(url) as conn:
        got = drain(conn, [q], 2, ack=False, prefetch_count=5)
        assert len(got) == 2
        got[0].channel.basic_recover(requeue=True)
        assert stats(port, kq)["ready"] == 2
        again = drain(conn, [q], 2)
    assert sorted(m.payload for m in again) == ["a", "b"]
    assert not any(m.delivery_info.get("redelivered") for m in again)  # releases are uncounted


def test_purge_size_delete(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, kombu.Exchange(f"{kq}-ex"), routing_key=kq)
    publish(url, q, list(range(5)))
    publish(url, q, [99], priority=6)
    with kombu.Connection(url) as conn:
        bound = q(conn.default_channel)
        assert bound.queue_declare(passive=True).message_count == 6
        assert bound.purge() == 6
        assert stats(port, kq)["ready"] == 0
        publish(url, q, [1])
        bound.declare()
        bound.delete()
    r = redis.Redis(port=port)
    assert r.exists(kq) == 0
    left = [k for k in r.keys(f"[{{]{kq}*") if b"}:r:" not in k]  # replies expire in 15 s
    assert left == []  # belayq's companion keys (counters ...) are gone too


def test_unstarted_messages_are_released_on_close(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, list(range(6)))
    with kombu.Connection(url) as conn:
        got = drain(conn, [q], 6, ack=False, prefetch_count=6)
        got[0].ack()
        assert stats(port, kq)["in_flight"] == 5
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["released"]) == (5, 0, 5)
    with kombu.Connection(url) as conn:
        again = drain(conn, [q], 5)
    assert [m.payload for m in again] == [1, 2, 3, 4, 5]  # released to the front, in order


def test_prefetch_one_claims_the_next_message_with_the_ack_and_releases_it_on_close(
    url: str, port: int, kq: str
) -> None:
    """At prefetch 1 the ack's round trip also claims the next message (held, undelivered,
    leased); closing hands it back uncounted, and it is never delivered twice."""
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, list(range(5)))
    got: list[Any] = []
    cb = [lambda b, m: (got.append(b), m.ack())]
    with kombu.Connection(url) as conn, kombu.Consumer(conn, [q], callbacks=cb,
                                                       prefetch_count=1):
        conn.drain_events(timeout=5)  # claims 0, hot: more was waiting
        conn.drain_events(timeout=5)  # delivers 1 after acking 0 ... and so on
        assert got == [0, 1]
        s = stats(port, kq)
        assert (s["acked"], s["in_flight"], s["ready"]) == (2, 1, 2)  # "2" is held
    s = stats(port, kq)
    assert (s["in_flight"], s["ready"], s["released"]) == (0, 3, 1)
    with kombu.Connection(url) as conn:
        rest = drain(conn, [q], 3, prefetch_count=1)
    assert [m.payload for m in rest] == [2, 3, 4]
    assert [m.delivery_info.get("redelivered", False) for m in rest] == [False] * 3


def test_no_ack_consumer_and_basic_get(url: str, port: int, kq: str) -> None:
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, ["x", "y", "z"])
    with kombu.Connection(url) as conn:
        got = drain(conn, [q], 1, ack=False, no_ack=True, prefetch_count=1)
        assert [m.payload for m in got] == ["x"]
        assert stats(port, kq)["in_flight"] == 0
        ch = conn.default_channel
        m = ch.basic_get(kq, no_ack=True)
        assert ch.message_to_python(m).payload == "y"
        m2 = ch.basic_get(kq)
        assert stats(port, kq)["in_flight"] == 1
        ch.basic_ack(m2.delivery_tag)
        assert ch.basic_get(kq) is None
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["acked"]) == (0, 0, 3)


def test_message_ttl_expires(url: str, kq: str) -> None:
    with kombu.Connection(url) as conn:
        q = conn.SimpleQueue(kq)
        q.put("short", expiration=0.3)
        q.put("long", expiration=60)
        time.sleep(0.5)
        m = q.get(timeout=5)
        assert m.payload == "long"
        m.ack()
        with pytest.raises(q.Empty):
            q.get(timeout=0.5)
        q.close()


def test_fanout_over_pubsub(url: str, kq: str) -> None:
    ex = kombu.Exchange(f"{kq}-fan", type="fanout", auto_delete=True)
    queues = [kombu.Queue(f"{kq}-f{i}", exchange=ex, auto_delete=True) for i in range(2)]
    received: list[Any] = []
    with kombu.Connection(url) as conn:
        consumers = [
            kombu.Consumer(conn.channel(), [q], callbacks=[lambda b, m: received.append(b)],
                           no_ack=True)
            for q in queues
        ]
        for c in consumers:
            c.consume()
        for _ in range(3):  # subscribe before publishing
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.2)
        with kombu.Connection(url) as pub:
            pub.Producer().publish("hello all", exchange=ex, declare=[ex])
        wait_for(lambda: _drain_once(conn) or len(received) >= 2, 5, "both fanout queues")
    assert received == ["hello all", "hello all"]


def _drain_once(conn: kombu.Connection) -> bool:
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.2)
    return False


def test_register_is_idempotent() -> None:
    belayq_kombu.register()
    belayq_kombu.register()
    assert TRANSPORT_ALIASES["belayq"] == belayq_kombu.SCHEMES["belayq"]


def test_a_consumer_callback_error_propagates_and_dead_letters_nothing(
    url: str, port: int, kq: str
) -> None:
    """As with the stock transport, an exception raised by the consumer's own callback
    reaches the caller of drain_events and the message stays unacked (only a message kombu
    cannot turn into a Message is quarantined by the transport)."""
    q = kombu.Queue(kq, routing_key=kq)
    publish(url, q, [{"n": 1}])

    def boom(body: Any, message: Any) -> None:
        raise RuntimeError("consumer bug")

    with kombu.Connection(url) as conn, kombu.Consumer(conn, [q], callbacks=[boom],
                                                       prefetch_count=1):
        with pytest.raises(RuntimeError, match="consumer bug"):
            conn.drain_events(timeout=5)
        s = stats(port, kq)
        assert (s["in_flight"], s["dead"]) == (1, 0)
    s = stats(port, kq)
    assert (s["ready"], s["in_flight"], s["dead"]) == (1, 0, 0)  # released on close
