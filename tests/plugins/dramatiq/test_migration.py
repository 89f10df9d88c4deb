"""A rolling migration from stock ``RedisBroker``: both brokers keep Dramatiq's keys, so a
stock worker runs what belayq producers send (delayed messages too, once due), and a belayq
worker runs what stock producers send (their delayed messages from the stock ``.DQ`` list
too), with real ``dramatiq`` workers."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import ConnectionClosed

from belayq import ConnectionLost, Delivery
from belayq_dramatiq import Broker
from tests.plugins.dramatiq.conftest import Workers, wait_recorded
from tests.support import wait_for


def send(broker: dramatiq.Broker, key: str, delay: int | None = None) -> None:
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="default", actor_name="mark", args=(key,), kwargs={}, options={})
    broker.enqueue(message, delay=delay)


def test_stock_and_belayq_brokers_share_a_queue_both_ways(
    url: str, conn: redis.Redis, workers: Workers
) -> None:
    # stock_delays: producers deployed while only stock workers run
    ours, stock = Broker(url=url, stock_delays=True), RedisBroker(url=url)
    for b in (ours, stock):
        b.declare_queue("default")
    try:
        # old workers still run while new producers deploy
        old = workers.start(stock=True)
        for i in range(10):
            send(ours, f"ours-{i}")
        send(ours, "ours-delayed", delay=300)
        done = wait_recorded(conn, "done", 11, 30)
        assert {k for k, _ in done} == {*(f"ours-{i}" for i in range(10)), "ours-delayed"}
        assert old.stop() == 0
        # old producers still send while new workers deploy
        for i in range(10):
            send(stock, f"stock-{i}")
        send(stock, "stock-delayed", delay=300)
        assert conn.llen("dramatiq:default.DQ") == 1  # where stock puts a delayed message
        workers.start()
        done = wait_recorded(conn, "done", 22, 30)
        assert {k for k, _ in done[11:]} == {*(f"stock-{i}" for i in range(10)),
                                              "stock-delayed"}
        assert len(done) == 22  # each ran once
        assert conn.llen("dramatiq:default.DQ") == 0
        assert conn.llen("dramatiq:default") == 0
        # the acked bodies go in a batch, at the latest when the worker finds the queue empty
        wait_for(lambda: conn.hlen("dramatiq:default.msgs") == 0, 15,
                 lambda: conn.hlen("dramatiq:default.msgs"))
    finally:
        ours.close()


def test_a_stock_delayed_message_moved_twice_is_stored_once(
    url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that moved a stock ``.DQ`` message into the delayed set but could not ack
    it hands it back; the next move is deduplicated by its id."""
    ours, stock = Broker(url=url), RedisBroker(url=url)
    for b in (ours, stock):
        b.declare_queue("default")
    try:
        send(stock, "once", delay=60_000)
        consumer = ours.consume("default.DQ", timeout=100)
        dq = ours.store("default.DQ")
        real_ack = dq.ack
        calls = []

        def ack_lost_once(delivery: Delivery) -> bool:
            calls.append(delivery)
            if len(calls) == 1:
                raise ConnectionLost("Redis unreachable during ack")
            return real_ack(delivery)

        monkeypatch.setattr(dq, "ack", ack_lost_once)
        try:
            next(consumer)
        except ConnectionClosed:
            pass
        else:  # what else holds the server (another consumer took the message?)
            pytest.fail(f"no ConnectionClosed: acks {calls}, .DQ list "
                        f"{conn.llen('dramatiq:default.DQ')}, {dq.core.stats()}, clients "
                        f"{[c.get('name') or c.get('addr') for c in conn.client_list()]}")
        assert conn.llen("dramatiq:default.DQ") == 1  # handed back at once
        assert next(consumer) is None
        assert len(calls) == 2 and conn.llen("dramatiq:default.DQ") == 0
        stats = ours.store("default").core.stats()
        assert stats["delayed"] == 1 and stats["published"] == 1  # stored once
    finally:
        ours.close()
