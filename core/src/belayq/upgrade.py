"""Upgrade a queue written with key schema 1 to schema 2, in place.

Schema 1 kept one hash per message (``<base>m:<id>``), a dead-letter *list*, claimed entries
in the processing list and a token counter in the stats hash. Schema 2 keeps per-queue
hashes (``meta``, ``payloads``), a dead-letter sorted set and no counter. The ready lists and
the delayed set keep their names and entries, so stock producers may go on pushing.

Shut every consumer of the old version down first: their claims cannot be carried over (their
tokens were counter values). Each message they held goes back to the head of its ready
list; its earlier deliveries count as runs, except the interrupted one. Dedup windows and
re-send replies of schema 1 are dropped. The upgrade is resumable: run it again after an
interruption; it ends by stamping ``schema = 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import SchemaMismatch
from .keys import SCHEMA_VERSION, QueueKeys, schema1_glob, schema1_message
from .models import entry_id
from .models import text as _text

_BELL = b"\0belayq:bell"


def upgrade_schema1(
    client: Any,
    name: str,
    *,
    ready_key: str | None = None,
    level_keys: Sequence[str] | None = None,
    prefix: str = "belayq",
    payload_in_list: bool = False,
    ready_head: str = "right",
) -> dict[str, int]:
    """Rewrite queue ``name``'s schema-1 keys as schema 2 (see the module doc).

    Args:
        client: A redis-py client (not a cluster client: run it against the node that holds
            the queue's slot).
        name, ready_key, level_keys, prefix, payload_in_list, ready_head: The queue's layout,
            as given to :class:`~belayq.ReliableQueue`.

    Returns:
        Counts: ``returned`` (claims put back), ``messages``, ``dead``.

    Raises:
        SchemaMismatch: The queue is not at schema 1 (already upgraded, or unknown).
    """
    steps = 1 + len(level_keys or ()) if ready_key is not None else 10
    keys = QueueKeys.build(
        name, prefix=prefix, steps=steps, ready_key=ready_key, level_keys=level_keys
    )
    found = client.hget(keys.stats, "schema")
    if found is None or int(found) != 1:
        raise SchemaMismatch(
            f"queue {name!r} is at schema {_text(found) if found else 'none'}, not 1: "
            "nothing to upgrade"
        )
    counts = {"returned": 0, "messages": 0, "dead": 0}
    push_head = client.lpush if ready_head == "left" else client.rpush

    def level_list(level: int) -> str:
        return keys.levels[min(max(level, 1), len(keys.levels)) - 1]

    # 1. Claims of the consumers shut down go back to the head of their levels.
    processing = keys.processing
    while True:
        entry = client.lindex(processing, -1)
        if entry is None:
            break
        if entry != _BELL:
            msg_id = entry_id(entry, payload_in_list)
            level = int(client.hget(schema1_message(keys, msg_id), "l") or 1)
            push_head(level_list(level), entry)
            counts["returned"] += 1
        client.rpop(processing)
    client.delete(keys.leases)
    # 2. The dead-letter list becomes a sorted set (dead-at as the score).
    dead_ids = [_text(i) for i in client.lrange(keys.dead, 0, -1)]
    if client.type(keys.dead) == b"list":
        client.delete(keys.dead)
    # 3. Every per-message hash becomes one field of meta and of payloads.
    dead = set(dead_ids)
    for key in client.scan_iter(match=schema1_glob(keys) + "m:*", count=500):
        msg_id = _text(key)[len(schema1_message(keys, "")) :]
        fields = client.hgetall(key)
        n = int(fields.get(b"n", 0))
        level = int(fields.get(b"l", 1))
        error = _text(fields.get(b"e", b"")).replace("|", "/")
        dead_ms = int(fields.get(b"d", 0))
        attempts = max(0, n - 1) if fields.get(b"t") else n
        payload = fields.get(b"p")
        pipe = client.pipeline()
        if n or error or dead_ms or msg_id in dead or client.zscore(keys.delayed, msg_id):
            pipe.hset(
                keys.meta,
                msg_id,
                f"{level} {n} {attempts} 0 0 {int(fields.get(b'u', 0))} {dead_ms} |{error}",
            )
        if payload is not None and (not payload_in_list or msg_id in dead
                                    or client.zscore(keys.delayed, msg_id) is not None):
            pipe.hset(keys.payloads, msg_id, payload)
        if msg_id in dead:
            pipe.zadd(keys.dead, {msg_id: dead_ms})
            counts["dead"] += 1
        pipe.delete(key)
        pipe.execute()
        counts["messages"] += 1
    # 4. Schema 1's short-lived keys go; the counters stay.
    base = schema1_message(keys, "")[: -len("m:")]
    for suffix in ("claimers", "sweep"):
        client.delete(base + suffix)
    for pattern in ("r:*", "dedup:*", "claim:*"):
        for key in client.scan_iter(match=schema1_glob(keys) + pattern, count=500):
            client.delete(key)
    client.hdel(keys.stats, "seq", "sweeps")
    client.hset(keys.stats, "schema", SCHEMA_VERSION)
    return counts

