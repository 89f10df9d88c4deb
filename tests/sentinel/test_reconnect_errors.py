"""The errors a failover brings, one at a time on a single server: a ``LOADING`` answer is
``ConnectionLost``, and a retried settlement that lands unconfirmed by the replicas
(``DurabilityError``, e.g. on a new primary whose replica has not reconnected yet) does not
make the keeper drop the settlements queued after it."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from belayq import ConnectionLost, ReliableQueue
from belayq.embedded import RedisServer
from tests.conftest import client_of


class Loading(redis.Redis):
    """A real client whose server answers LOADING to every script (a restarted or freshly
    synced node loading its data set)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() in ("EVALSHA", "FCALL"):
            raise redis.BusyLoadingError("Redis is loading the dataset in memory")
        return super().execute_command(*args, **options)


def test_loading_is_connection_lost(redis_server: RedisServer, qname: str) -> None:
    client = Loading(port=redis_server.port)
    try:
        q = ReliableQueue(client, qname, keeper=False)
        for call in (lambda: q.publish("x"), lambda: q.claim(timeout=0), q.sweep, q.stats):
            with pytest.raises(ConnectionLost, match="loading"):
                call()
    finally:
        client.close()


def test_unconfirmed_retry_keeps_the_rest_queued(redis_server: RedisServer, qname: str) -> None:
    # A lone server: WAIT 1 confirms nothing, so every durable settle raises DurabilityError
    # after it landed.
    with client_of(redis_server) as client:
        plain = ReliableQueue(client, qname, keeper=False)
        plain.publish_many(["a", "b", "c"])
        q = ReliableQueue(client, qname, keeper=False, wait_replicas=1, wait_timeout_ms=50)
        held = q.claim(timeout=1, count=3)
        assert len(held) == 3
        q.retry_later("ack", held[:2])
        q.retry_later("release", held[2:])
        assert q.retry_unsettled() == 0, "settlements after an unconfirmed one were dropped"
        assert q.held == []
        stats = plain.stats()
        assert (int(stats["in_flight"]), int(stats["ready"])) == (0, 1), stats
