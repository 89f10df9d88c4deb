"""A dropped queue leaves no key behind: every key name keys.py builds for a queue is
deleted, so a key added to the layout later cannot be forgotten by ``drop``."""

from __future__ import annotations

from typing import Any

import redis

from belayq import ReliableQueue
from belayq.keys import QueueKeys

from .conftest import run


def every_key_name(keys: QueueKeys) -> set[str]:
    """Every key name keys.py builds for the queue: its fields and its named properties (but
    ``events``, a pub/sub channel, no key)."""
    named = {getattr(keys, n) for n, v in vars(QueueKeys).items()
             if isinstance(v, property) and n != "events"}
    return set(keys.all_keys()) | {k for k in named if isinstance(k, str)}


def used_in_every_way(q: ReliableQueue) -> None:
    q.publish(b"waits")
    q.publish(b"low", priority=6)
    q.publish(b"later", delay_ms=600_000)
    q.publish(b"fails")
    q.publish(b"done")
    [d] = q.claim(timeout=0)
    q.ack(d)
    [d] = q.claim(timeout=0)
    q.dead_letter(d, "boom")
    q.pause(by="ops@host")
    q.resume(by="ops@host")
    assert q.lead() is True  # something is delayed: this process leads the queue


def test_drop_leaves_no_key_of_the_queue(
    client: redis.Redis, url: str, make_queue: Any, capsys: Any
) -> None:
    q = make_queue(client, priority_steps=(0, 3, 6), history_max=5, lease_ms=5_000)
    used_in_every_way(q)
    names = every_key_name(q.keys)
    assert q.keys.lead in names and client.exists(q.keys.lead)
    for key in names - {q.keys.processing, q.keys.leases}:
        if not client.exists(key):
            client.hset(key, "placeholder", "1")  # a key no use above wrote is dropped too
    assert all(client.exists(k) for k in names - {q.keys.processing, q.keys.leases})
    code, _, _ = run(capsys, "drop", "--url", url, q.name, "--yes")
    assert code == 0
    assert [k for k in names if client.exists(k)] == []
    assert client.keys(f"*{{{q.name}}}*") == []
