"""The contract suite (docs/design.md §2), written once against a queue factory.

A subclass provides the ``new_queue`` fixture: a callable returning a fresh consumer of
one shared queue each time it is called (same name, new object, as a new process would
get). The core runs it on four backends (test_core_contract.py); the adapters have suites of
their own (kombu's and RQ's peer suites and tests/plugins).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from belayq import ReliableQueue

NewQueue = Callable[..., ReliableQueue]


def advance(queues: list[ReliableQueue], ms: int) -> None:
    for q in queues:
        q._scripts.skew_ms += ms


class QueueContract:
    """Every test takes ``new_queue(**options)``."""

    def test_no_loss_publish_claim_ack(self, new_queue: NewQueue) -> None:
        q = new_queue()
        ids = q.publish_many([b"m%d" % i for i in range(50)])
        seen: list[str] = []
        while True:
            got = q.claim(timeout=0, count=7)
            if not got:
                break
            assert q.ack_many(got) == [True] * len(got)
            seen += [d.id for d in got]
        assert seen == ids
        assert q.stats()["ready"] == 0 and q.stats()["in_flight"] == 0

    def test_dead_consumer_messages_come_back(self, new_queue: NewQueue) -> None:
        crashed, survivor = new_queue(lease_ms=1_000), new_queue(lease_ms=1_000)
        msg_id = crashed.publish(b"work")
        [d] = crashed.claim(timeout=0)  # then the process "dies": no ack, no extend
        assert survivor.claim(timeout=0) == []
        advance([crashed, survivor], 1_001)
        [again] = survivor.claim(timeout=0)
        assert (again.id, again.deliveries) == (msg_id, 2)
        assert crashed.ack(d) is False  # the late ack is fenced off
        assert survivor.ack(again) is True
        assert survivor.stats()["stale_acks"] == 1

    def test_live_consumer_keeps_long_work(self, new_queue: NewQueue) -> None:
        worker = new_queue(lease_ms=300, keeper=True, sweep_interval_ms=50)
        other = new_queue(lease_ms=300)
        worker.publish(b"long")
        [d] = worker.claim(timeout=0)
        end = time.monotonic() + 1.2  # 4x the lease, in real time
        while time.monotonic() < end:
            assert other.claim(timeout=0) == []
            time.sleep(0.05)
        assert worker.ack(d) is True
        worker.close()

    def test_poison_message_is_dead_lettered(self, new_queue: NewQueue) -> None:
        q = new_queue(max_deliveries=2, lease_ms=1_000)
        msg_id = q.publish(b"poison")
        for _ in range(2):
            assert len(q.claim(timeout=0)) == 1
            advance([q], 1_001)
        q.sweep()
        assert q.claim(timeout=0) == []
        [dead] = q.dead_letters()
        assert dead.id == msg_id and "lease expired" in dead.reason
        assert q.replay_dead() == 1 and q.claim(timeout=0)[0].deliveries == 1

    def test_blocking_claim_wakes_on_publish(self, new_queue: NewQueue) -> None:
        consumer, producer = new_queue(), new_queue()
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.extend(consumer.claim(timeout=5)))
        t.start()
        time.sleep(0.2)
        msg_id = producer.publish(b"wake")
        t.join(6)
        assert [d.id for d in result] == [msg_id]
        assert consumer.ack(result[0])

    def test_claim_timeout_returns_empty(self, new_queue: NewQueue) -> None:
        q = new_queue()
        start = time.monotonic()
        assert q.claim(timeout=0.2) == []
        assert time.monotonic() - start >= 0.19

    def test_release_on_clean_shutdown(self, new_queue: NewQueue) -> None:
        a, b = new_queue(), new_queue()
        a.publish_many([b"1", b"2"])
        got = a.claim(timeout=0, count=2)
        a.close(release=True)
        again = b.claim(timeout=0, count=2)
        assert [d.id for d in again] == [d.id for d in got]
        assert [d.deliveries for d in again] == [1, 1]
