"""belayq_dramatiq.Broker in process, with Dramatiq's own Worker and middleware: dead
letters with their reasons, retries waiting in Redis, Callbacks, Pipelines, Results,
AgeLimit, TimeLimit, prefetched claims handed back uncounted, the registry's kind."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import TimeLimitExceeded
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from belayq import ConfigError, ConnectionLost, ReliableQueue
from belayq.kinds import tools_for
from belayq.registry import Registry
from belayq_dramatiq import Broker
from tests.support import wait_for


@pytest.fixture(params=[None, 3], ids=["stock_keys", "shards3"])
def broker(url: str, conn: redis.Redis, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The broker in stock's keys, and in belayq's own over 3 shards."""
    b = Broker(url=url, lease_ms=2000, shards=request.param)
    b.add_middleware(Results(backend=RedisBackend(client=redis.Redis.from_url(url))))
    b.emit_after("process_boot")  # as the dramatiq command does (TimeLimit's timer)
    dramatiq.set_broker(b)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def worker(broker: Broker) -> Iterator[Worker]:
    w = Worker(broker, worker_timeout=100, worker_threads=4)
    w.start()
    try:
        yield w
    finally:
        w.stop()


def drain(broker: Broker, worker: Worker, queue: str = "default") -> None:
    broker.join(queue, timeout=20_000)
    worker.join()


def reasons(broker: Broker, queue: str = "default") -> list[str]:
    return sorted(d.reason for d in broker.store(queue).core.dead_letters())


def test_nack_dead_letters_with_the_reason(broker: Broker, worker: Worker) -> None:
    @dramatiq.actor(max_retries=0)
    def fails() -> None:
        raise ValueError("boom")

    message = fails.send()
    drain(broker, worker)
    assert reasons(broker) == ["ValueError: boom"]
    # counted once, as the dead letter: its run is no failed run to retry
    core = broker.store("default").core
    tools = tools_for("dramatiq")
    assert tools is not None
    assert tools.failed(core, 10) == []  # type: ignore[attr-defined]
    # the message as the dashboard opens it: by its entry in the queue (in stock's keys the
    # id it was sent with; in belayq's own, the core's id)
    [dead] = core.dead_letters()
    entry = message.options["redis_message_id"] if broker.shards is None else dead.id
    detail = tools.message(core, entry)  # type: ignore[attr-defined]
    assert detail["actor_name"] == "fails" and "last_failure" not in detail


def test_a_failed_run_that_is_retried_is_recorded_with_its_traceback(
    broker: Broker, worker: Worker
) -> None:
    runs: list[int] = []

    @dramatiq.actor(max_retries=1, min_backoff=10, max_backoff=20)
    def flaky() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("boom")

    message = flaky.send()
    drain(broker, worker)
    core = broker.store("default").core
    tools = tools_for("dramatiq")
    assert tools is not None
    [row] = tools.failed(core, 10)  # type: ignore[attr-defined]
    assert (row["id"], row["task"], row["reason"]) == (message.message_id, "flaky",
                                                       "ValueError: boom")
    # asked by Dramatiq's own id (no body under it): the failed run, as a failed job
    run = tools.message(core, message.message_id)  # type: ignore[attr-defined]
    assert (run["framework"], run["status"], run["task"]) == ("dramatiq", "failed", "flaky")
    assert "raise ValueError" in run["exc_info"]


def test_unknown_actor_is_dead_lettered_with_the_reason(broker: Broker, worker: Worker) -> None:
    broker.declare_queue("default")
    broker.enqueue(dramatiq.Message(queue_name="default", actor_name="nobody", args=(),
                                    kwargs={}, options={}))
    drain(broker, worker)
    [reason] = reasons(broker)
    assert reason.startswith("ActorNotFound")


def test_retries_keep_deciding_and_their_backoff_waits_in_redis(
    broker: Broker, worker: Worker
) -> None:
    runs: list[float] = []

    @dramatiq.actor(max_retries=1, min_backoff=300, max_backoff=300)
    def flaky() -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise RuntimeError("first")

    flaky.send()
    core = broker.store("default").core
    wait_for(lambda: core.stats()["delayed"] == 1, 10, core.stats)  # the retry, in Redis
    drain(broker, worker)
    assert len(runs) == 2 and runs[1] - runs[0] >= 0.14  # Retries' jitter: 150-300 ms
    assert core.stats()["promoted"] == 1 and reasons(broker) == []


def test_callbacks_pipelines_and_results_work_unchanged(broker: Broker, worker: Worker) -> None:
    seen: list[Any] = []

    @dramatiq.actor(store_results=True)
    def add(x: int, y: int) -> int:
        return x + y

    @dramatiq.actor
    def on_ok(message: dict[str, Any], result: int) -> None:
        seen.append(result)

    pipe = add.message(1, 2) | add.message(10)
    pipe.run()
    assert pipe.get_result(block=True, timeout=10_000) == 13
    add.send_with_options(args=(20, 22), on_success=on_ok)
    wait_for(lambda: seen, 10, "the on_success callback")
    assert seen == [42]


def test_age_and_time_limits_dead_letter_with_their_reasons(
    broker: Broker, worker: Worker
) -> None:
    @dramatiq.actor(max_retries=0, time_limit=200)
    def too_long() -> None:
        for _ in range(100):
            time.sleep(0.05)

    @dramatiq.actor(max_retries=0, max_age=1)
    def too_old() -> None:
        raise AssertionError("not run")

    too_long.send()
    too_old.send_with_options(delay=50)
    drain(broker, worker)
    age, limit = reasons(broker)  # sorted
    assert age == "SkipMessage: Message age limit exceeded"
    assert limit.startswith(TimeLimitExceeded.__name__)


def test_prefetched_messages_go_back_uncounted_on_close(broker: Broker) -> None:
    broker.declare_queue("default")
    for _ in range(3):
        broker.enqueue(dramatiq.Message(queue_name="default", actor_name="x", args=(),
                                        kwargs={}, options={}))
    consumer = broker.consume("default", prefetch=3, timeout=100)
    first = next(consumer)
    assert first is not None and consumer.outstanding_message_count == 3
    consumer.close()  # the two still cached go back
    core = broker.store("default").core
    stats = core.stats()
    assert stats["ready"] == 2 and stats["in_flight"] == 1
    consumer.requeue([first])  # as a stopping worker does with what it never started
    assert core.stats()["ready"] == 3
    assert all(lease.attempts == 0 for lease in core.in_flight())


def test_queues_are_recorded_as_kind_dramatiq(broker: Broker, conn: redis.Redis) -> None:
    broker.declare_queue("emails")
    [record] = [r for r in Registry(conn).all() if r.name == "emails"]
    assert record.kind == "dramatiq"
    if broker.shards is None:
        assert (record.ready_key, record.shards) == ("dramatiq:emails", 1)
    else:
        assert (record.ready_key, record.shards) == (None, broker.shards)
    assert record.lease_ms == 2000


def test_claims_that_cannot_be_made_into_messages_are_handed_back(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.declare_queue("default")
    store = broker.store("default")
    store.core.publish(b"not a Dramatiq message")

    def unreachable(*args: object) -> None:
        raise ConnectionLost("Redis unreachable during the dead-letter")

    monkeypatch.setattr(store.core, "dead_letter", unreachable)
    consumer = broker.consume("default", prefetch=2, timeout=100)
    with pytest.raises(ConnectionClosed):  # Dramatiq's consumer thread restarts it
        next(consumer)
    stats = store.core.stats()
    assert (stats["ready"], stats["in_flight"]) == (1, 0)  # back at once, uncounted
    assert store.core.held == []  # nothing kept alive by this process


def test_entries_that_are_no_message_are_dead_lettered_and_the_next_one_runs(
    url: str, conn: redis.Redis
) -> None:
    """In stock's keys: an id pushed without its body (the claim dead-letters it), and a
    body Dramatiq cannot decode (the consumer does), each with its reason."""
    broker = Broker(url=url)
    try:
        broker.declare_queue("default")
        conn.rpush("dramatiq:default", "no-body")
        conn.hset("dramatiq:default.msgs", "garbled", b"{not json")
        conn.rpush("dramatiq:default", "garbled")
        good = broker.enqueue(dramatiq.Message(queue_name="default", actor_name="x",
                                               args=(), kwargs={}, options={}))
        consumer = broker.consume("default", prefetch=4, timeout=500)
        got = next(consumer)
        assert got is not None and got.message_id == good.message_id
        consumer.ack(got)
        core = broker.store("default").core
        dead = {d.id: d.reason for d in core.dead_letters()}
        assert set(dead) == {"no-body", "garbled"}, dead
        assert "payload missing" in dead["no-body"]
        assert "undecodable message" in dead["garbled"]
        assert conn.hkeys("dramatiq:default.msgs") == [b"garbled"]  # kept with its letter
        consumer.close()
    finally:
        broker.close()


def test_options_are_checked_when_the_broker_is_built() -> None:
    for options, named in (({"lease_ms": 5000}, "own keywords"),
                           ({"payload_in_list": False}, "sets ['payload_in_list'] itself"),
                           ({"leas_ms": 5000}, "unknown"),
                           ({"sweep_interval_ms": 0}, "sweep_interval_ms")):
        with pytest.raises(ConfigError, match=re.escape(named)):
            Broker(url="redis://127.0.0.1:1/0", belayq_options=options)
    with pytest.raises(ConfigError, match="lease_ms"):
        Broker(url="redis://127.0.0.1:1/0", lease_ms=10)
    # stock RedisBroker's maintenance settings are accepted, so the swap needs no edit
    Broker(url="redis://127.0.0.1:1/0", maintenance_chance=1000, heartbeat_timeout=60000,
           dead_message_ttl=1000).close()


def counting_sends(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The commands every redis-py connection sends from now until ``monkeypatch.undo()``."""
    sends: list[Any] = []
    real = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sends.append(command)
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return sends


def test_an_enqueue_is_one_round_trip_with_its_body(
    broker: Broker, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One script either way: in stock's keys it writes the body to ``.msgs`` under the id
    it pushes; in belayq's own keys the body is the message."""
    @dramatiq.actor
    def noop(n: int) -> None:
        pass

    noop.send(0)  # the queue, the scripts: loaded
    sends = counting_sends(monkeypatch)
    message = noop.send(1)
    monkeypatch.undo()
    assert len(sends) == 1, sends
    core = broker.store("default").core
    assert core.stats()["ready"] == 2
    body = conn.hget(f"dramatiq:{message.queue_name}.msgs", message.options["redis_message_id"])
    if isinstance(core, ReliableQueue):  # stock's keys: the body in the queue's hash
        assert body == message.encode()
    else:
        assert body is None


def test_a_claim_is_one_round_trip_with_the_bodies_and_an_ack_deletes_its_body(
    broker: Broker, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer's claim returns the bodies with the leases (no read of its own), and
    each ack deletes its message's body in the script that accepts it."""
    @dramatiq.actor
    def noop(n: int) -> None:
        pass

    consumer = broker.consume("default", prefetch=5, timeout=1000)
    noop.send(-1)
    warm = next(consumer)  # the scripts loaded, the consumer registered
    assert warm is not None
    consumer.ack(warm)
    sent = [noop.send(i) for i in range(5)]
    sends = counting_sends(monkeypatch)
    got = [next(consumer) for _ in range(5)]
    monkeypatch.undo()
    shown = [bytes(c[0] if isinstance(c, list) else c)[:80] for c in sends]
    core = broker.store("default").core
    # in belayq's own keys the claim visits the shards that hold messages, a script each
    assert len(sends) == 1 if isinstance(core, ReliableQueue) else 1 <= len(sends) <= 6, shown
    assert all(b"FCALL" in c or b"EVALSHA" in c for c in shown), shown
    assert sorted(m.args[0] for m in got if m is not None) == [0, 1, 2, 3, 4]
    bodies = "dramatiq:default.msgs"
    if isinstance(core, ReliableQueue):
        assert conn.hlen(bodies) == 5
    for m in got:
        consumer.ack(m)
    assert conn.hlen(bodies) == 0 and conn.exists(bodies) == 0
    s = core.stats()
    assert (s["in_flight"], s["ready"], s["acked"]) == (0, 0, 1 + len(sent))
    consumer.close()
