"""The connections of a Sentinel-managed pool that a lease keeper follows never wait on a
sentinel that does not answer (core/src/belayq/primary.py): they go to the primary the
watcher found last, and without a running watcher a lookup is bounded."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from belayq import ReliableQueue
from belayq.embedded import RedisSentinelServers
from belayq.primary import SENTINEL_TIMEOUT_S, watcher_of

pytestmark = pytest.mark.timeout(120)

#: Far longer than any bounded lookup; a call still running after it waits on a sentinel.
HUNG_S = 15.0


@contextmanager
def frozen(group: RedisSentinelServers, which: list[int]) -> Iterator[None]:
    procs = [group.sentinels[i].proc for i in which]
    for p in procs:
        assert p is not None
        p.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for p in procs:
            assert p is not None
            p.send_signal(signal.SIGCONT)


def returns(call: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``call`` on a thread: its result and how long it took; fails if it hangs."""
    out: list[Any] = []
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    t.join(HUNG_S)
    assert out, f"the call was still waiting after {HUNG_S} s"
    return out[0], time.monotonic() - t0


def kept_queue(group: RedisSentinelServers, qname: str) -> tuple[redis.Redis, ReliableQueue]:
    """A queue on a client built as the README does (no sentinel timeout), kept by the
    lease keeper (it claimed), with its watcher's first lookup done."""
    client = Sentinel(group.sentinel_addresses).master_for(group.service_name, socket_timeout=5)
    q = ReliableQueue(client, qname, sweep_interval_ms=200)
    q.publish(b"x")
    assert q.claim(timeout=1)
    watcher = watcher_of(client)
    assert watcher is not None
    deadline = time.monotonic() + 10
    while watcher.address is None:
        assert time.monotonic() < deadline, "the watcher found no primary"
        time.sleep(0.05)
    return client, q


@pytest.mark.parametrize("which", [[0], [0, 1, 2]], ids=["one", "all"])
def test_a_kept_pools_new_connection_never_waits_on_a_stopped_sentinel(
    sentinel_servers: RedisSentinelServers, qname: str, which: list[int]
) -> None:
    group = sentinel_servers
    client, q = kept_queue(group, qname)
    try:
        with frozen(group, which):
            time.sleep(3 * SENTINEL_TIMEOUT_S)  # the watcher meets the stopped sentinels
            client.connection_pool.disconnect()
            stats, _ = returns(q.stats)
            assert stats["in_flight"] == 1
            assert q.ack(q.held[0])
    finally:
        q.close()
        client.close()


def test_without_a_watcher_thread_a_lookup_is_bounded(
    sentinel_servers: RedisSentinelServers, qname: str
) -> None:
    """A pool whose queue is no longer kept: its last answer grows old, and a new
    connection asks the sentinels again, one try of SENTINEL_TIMEOUT_S each."""
    group = sentinel_servers
    client, q = kept_queue(group, qname)
    watcher = watcher_of(client)
    assert watcher is not None
    try:
        q.close()
        while watcher._running():
            time.sleep(0.05)
        with frozen(group, [0]):
            time.sleep(2.5)  # past TRUSTED_S
            client.connection_pool.disconnect()
            before = watcher.lookups
            pong, took = returns(client.ping)
            assert pong is True
            assert watcher.lookups > before, "the new connection did not ask the sentinels"
            print(f"\n[primary watcher] a lookup past a stopped sentinel took {took:.2f} s")
    finally:
        client.close()
