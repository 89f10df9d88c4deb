"""belayq_dramatiq.Broker through a Sentinel failover (the primary SIGKILLed while a
Dramatiq Worker runs messages, a replica promoted), with ``wait_replicas=1``: every message
sent before and after runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis.sentinel import Sentinel

from belayq.embedded import RedisSentinelServers
from belayq_dramatiq import Broker
from tests.plugins.dramatiq.inproc import Ran, run_with_worker
from tests.support import wait_for


@pytest.mark.timeout(120)
def test_through_a_sentinel_failover_every_message_runs(
    start_sentinels: Callable[..., RedisSentinelServers],
) -> None:
    group = start_sentinels()
    sentinel = Sentinel(group.sentinel_addresses, socket_timeout=2)
    client = sentinel.master_for(group.service_name, socket_timeout=5)
    broker = Broker(client=client, lease_ms=3000, belayq_options={"wait_replicas": 1})

    def body(ran: Ran) -> None:
        for i in range(20):
            ran.actor.send(f"before-{i}")
        wait_for(lambda: len(ran.seen()) >= 5, 30, ran.seen)
        old = group.kill_primary()
        group.wait_for_new_primary(old, replicas=1)
        for i in range(10):
            ran.actor.send(f"after-{i}")
        expected = {*(f"before-{i}" for i in range(20)), *(f"after-{i}" for i in range(10))}
        wait_for(lambda: ran.seen() >= expected, 60, lambda: expected - ran.seen())

    run_with_worker(broker, body)
