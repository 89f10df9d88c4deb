"""The registry's rules, total: a valid configuration is never refused because of a value
another process recorded; the settings that change what a script writes (the bell) are
recorded and applied by whoever opens the queue without naming them; a queue's identity
holds its namespace; and a full server never keeps a queue from opening to drain it."""

from __future__ import annotations

import logging

import pytest
import redis

from belayq import ReliableQueue
from belayq.registry import Registry


def test_a_recorded_lease_shorter_than_my_heartbeat_does_not_refuse_my_valid_configuration(
    r: redis.Redis, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    ReliableQueue(r, qname, keeper=False, lease_ms=8_000)
    with caplog.at_level(logging.WARNING, logger="belayq"):
        q = ReliableQueue(r, qname, keeper=False, heartbeat_interval_ms=10_000)
    assert q.config.heartbeat_interval_ms == 10_000
    assert q.config.lease_ms > q.config.heartbeat_interval_ms  # its leases outlive a beat
    assert any("8000" in rec.getMessage() and "heartbeat_interval_ms" in rec.getMessage()
               for rec in caplog.records)
    rec = Registry(r).get("belayq", qname)
    assert rec is not None and rec.lease_ms == 8_000  # the record stays the fleet's
    other = ReliableQueue(r, qname, keeper=False)  # a process naming nothing still adopts it
    assert other.config.lease_ms == 8_000
