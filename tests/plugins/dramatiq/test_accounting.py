"""How a Dramatiq queue's messages are counted: a message whose retries ran out is one dead
letter (not also a failed run under another id), every run that raised counts among the
failed runs, and each message's wait from its send (or its retry's requeue) to its claim
fills the queue-wait histogram."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest
import redis
from dramatiq import Worker

from belayq import failures
from belayq.observing import read_histogram, read_observed
from belayq_dramatiq import Broker
from tests.support import wait_for


@pytest.fixture
def broker(url: str, conn: redis.Redis) -> Iterator[Broker]:
    """A broker with a Dramatiq worker in this process, on a flushed server."""
    b = Broker(url=url, lease_ms=2000)
    dramatiq.set_broker(b)
    worker = Worker(b, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        yield b
    finally:
        worker.stop()
        b.close()


def test_a_message_that_exhausted_its_retries_is_one_dead_letter_not_also_a_failed_run(
    broker: Broker,
) -> None:
    runs: dict[str, int] = {"always": 0, "once": 0}

    @dramatiq.actor(max_retries=2, min_backoff=10, max_backoff=20)
    def always() -> None:
        runs["always"] += 1
        raise ValueError("boom")

    @dramatiq.actor(max_retries=2, min_backoff=10, max_backoff=20)
    def once() -> None:
        runs["once"] += 1
        if runs["once"] == 1:
            raise ValueError("first")

    gave_up, recovered = always.send(), once.send()
    broker.join("default", timeout=20_000)
    core = broker.store("default").core
    assert runs == {"always": 3, "once": 2}
    [dead] = core.dead_letters()
    assert dead.reason == "ValueError: boom"
    # Counted once, as that dead letter: no failed-run record of it (under Dramatiq's id)
    assert failures.get(core, gave_up.message_id) is None
    # A message that failed once and then ran keeps its failed run's record
    assert [r["id"] for r in failures.newest(core, 10)] == [recovered.message_id]
    # Every run that raised is a failed run: 3 of the first message, 1 of the second
    core.flush_observations()
    assert read_observed(core.client, core.keys).get("failed") == 4


def test_the_queue_wait_of_dramatiq_messages_fills_its_histogram(broker: Broker) -> None:
    @dramatiq.actor(max_retries=1, min_backoff=10, max_backoff=20)
    def work(fail: bool) -> None:
        if fail and not work.failed_once:
            work.failed_once = True
            raise ValueError("once")

    work.failed_once = False  # type: ignore[attr-defined]
    for i in range(3):
        work.send(i == 0)
    broker.join("default", timeout=20_000)
    core = broker.store("default").core
    core.flush_observations()
    buckets, total_s = read_histogram(read_observed(core.client, core.keys), "wait")
    # three sends and one retry's requeue, each claimed once
    assert buckets[-1] == ("+Inf", 4.0)
    assert 0 < total_s < 30


def test_a_dead_letter_counts_every_run_and_its_replay_gets_every_retry_again(
    broker: Broker,
) -> None:
    runs: list[int] = []

    @dramatiq.actor(max_retries=2, min_backoff=10, max_backoff=20)
    def always() -> None:
        runs.append(1)
        raise ValueError("boom")

    always.send()
    core = broker.store("default").core
    wait_for(lambda: len(core.dead_letters()) == 1, 20, core.stats)
    [dead] = core.dead_letters()
    assert len(runs) == 3
    assert (dead.deliveries, dead.attempts) == (3, 3)  # its three runs, under three ids
    # replayed, it runs as a fresh message: its first run and both retries
    assert core.replay_dead() == 1
    wait_for(lambda: len(runs) == 6 and len(core.dead_letters()) == 1, 20,
             lambda: (len(runs), core.stats()))
    broker.join("default", timeout=20_000)
    assert len(runs) == 6
    [dead] = core.dead_letters()
    assert (dead.deliveries, dead.attempts) == (3, 3)
