"""Claim from several queues in priority order, waiting on all of them at once.

BLMOVE takes one source list and cannot run inside Lua, so a consumer of several queues
cannot block on them with one command. :func:`claim_any` first tries each queue in
priority order with :meth:`ReliableQueue.try_claim` (one script each, no gap); when all
are empty it blocks on every queue at the same time, with no polling:

1. each queue's :class:`~belayq.blocking.BlockingClaim` sends its BLMOVE on a pooled
   connection (which learned its ``CLIENT ID`` once);
2. :mod:`selectors` waits on those sockets;
3. on the first reply the other connections are released with ``CLIENT UNBLOCK`` (sent
   from the queues' ordinary clients) and their replies read too: each is nil or an entry
   that now sits in that queue's processing list;
4. every entry received is leased with :meth:`~ReliableQueue.lease_claimed`, and
   deliveries beyond ``count`` are handed back to the front with
   :meth:`~ReliableQueue.release`.

No entry is ever only in this process's memory: between the BLMOVE and its lease an entry
sits in a processing list, where the sweep gives it a provisional lease and returns it
after ``lease_ms`` if this process dies. A connection that cannot be unblocked (no
permission for CLIENT UNBLOCK, an error mid-way) is closed instead, with the same
guarantee.

On Redis Cluster the same is done with the connection pool of each queue's node (all keys
of one queue share a slot); a redirection (MOVED/ASK during a resharding) ends the round
as if nothing came, and the next non-blocking try refreshes the slot map.

TLS connections are waited on the same way. A TLS connection may hold reply bytes that a
select no longer sees (taken off the socket and decrypted, or in redis-py's read buffer),
so before each select every connection is asked whether a reply can be read now
(:meth:`BlockingClaim.buffered`), and after a select only the connections that say so are
read.

fakeredis (its blocking commands return at once) gets a slower but correct fallback: a
non-blocking try of every queue, then a sleep of ``FALLBACK_SLICE_S``; pickup takes up to
one slice on every queue.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Sequence

import redis

from . import client_info
from .blocking import BlockingClaim
from .constants import CLAIM_ANY_ROUND_MAX_S, CLUSTER_RETRY_FIRST_PAUSE_S
from .errors import ConfigError, ConnectionLost, drop_connections, left_primary
from .models import Delivery
from .queue import ReliableQueue

FALLBACK_SLICE_S = 0.05
"""Longest wait of one fallback round (s): the pickup latency of fakeredis."""


def claim_any(
    queues: Sequence[ReliableQueue], timeout: float | None = 1.0, count: int = 1
) -> list[Delivery]:
    """Claim up to ``count`` messages from the first non-empty queue(s), in priority order.

    Args:
        queues: The queues, highest priority first.
        timeout: Seconds to wait for the first message; 0 = do not wait; None = wait
            until one comes.
        count: Most messages to claim. Higher-priority queues fill it first.

    Returns:
        The deliveries, highest-priority queue first; ``[]`` on timeout.

    Raises:
        ConfigError: No queues, the same queue twice, or a bad ``count``.
        ConnectionLost: Redis could not be reached.
    """
    if not queues:
        raise ConfigError("claim_any needs at least one queue")
    if len({q.keys.ready for q in queues}) != len(queues):
        raise ConfigError("claim_any got the same queue more than once")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"count must be an int >= 1, got {count!r}")
    try:
        return _claim_any(list(queues), timeout, count)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ConnectionLost(f"Redis unreachable during claim_any: {exc}") from exc
    except redis.ResponseError as exc:
        if not left_primary(exc):
            raise
        for q in queues:
            drop_connections(q.client)
        raise ConnectionLost(f"the server left the primary role during claim_any: {exc}") from exc


def _claim_any(queues: list[ReliableQueue], timeout: float | None, count: int) -> list[Delivery]:
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    mode = _wait_mode(queues)
    if mode == "select" and len(queues) == 1 and not client_info.is_cluster(queues[0].client):
        return queues[0].claim(timeout, count)
    while True:
        got, due_ms = _try_each(queues, count)
        if got or timeout == 0:
            return got
        wait = CLAIM_ANY_ROUND_MAX_S if deadline is None else deadline - time.monotonic()
        if wait <= 0:
            return []
        wait = min(wait, CLAIM_ANY_ROUND_MAX_S)
        if due_ms >= 0:  # a delayed message falls due: try again then
            wait = min(wait, max(due_ms, 1) / 1000)
        if mode == "select":
            entries = _wait_select_through_failover(queues, wait)
        else:
            time.sleep(min(wait, FALLBACK_SLICE_S))
            entries = []
        got = _lease_all(queues, entries, count)
        if got:
            return got


def _try_each(queues: list[ReliableQueue], count: int) -> tuple[list[Delivery], int]:
    """Non-blocking claims in priority order until ``count`` is reached."""
    got: list[tuple[ReliableQueue, Delivery]] = []
    due_ms = -1
    try:
        for q in queues:
            more, due = q.try_claim(count - len(got))
            got.extend((q, d) for d in more)
            if due >= 0:
                due_ms = due if due_ms < 0 else min(due_ms, due)
            if len(got) >= count:
                break
    except BaseException:
        _give_back(got)
        raise
    return [d for _, d in got], due_ms


def _lease_all(
    queues: list[ReliableQueue], entries: list[tuple[int, bytes]], count: int
) -> list[Delivery]:
    """Lease every BLMOVE-d entry (highest priority first); hand back what exceeds count."""
    got: list[tuple[ReliableQueue, Delivery]] = []
    try:
        for i, entry in sorted(entries, key=lambda e: e[0]):
            leased, _ = queues[i].lease_claimed(entry, 1)
            got.extend((queues[i], d) for d in leased)
    except BaseException:
        _give_back(got)  # entries not leased yet sit in landing zones: the sweep finds them
        raise
    _give_back(got[count:])
    return [d for _, d in got[:count]]


def _give_back(claims: list[tuple[ReliableQueue, Delivery]]) -> None:
    """Release claims the caller will never see; if Redis will not take them, stop keeping
    them, so the sweep returns them after their lease instead of never."""
    for q, d in claims:
        try:
            q.release([d])
        except Exception:
            q.forget([d])


def _wait_mode(queues: Sequence[ReliableQueue]) -> str:
    """``select``, or ``sleep`` for fakeredis."""
    for q in queues:
        if type(q.client).__module__.split(".")[0] == "fakeredis":
            return "sleep"
    return "select"


def _wait_select_through_failover(
    queues: list[ReliableQueue], wait: float
) -> list[tuple[int, bytes]]:
    """:func:`_wait_select`; on a cluster, a node lost mid-wait (its master killed or
    failing over) ends the round empty: the next round's non-blocking claims wait for the
    slot's new owner (``cluster_retry_ms``) and the BLMOVEs after them go there. An entry a
    lost BLMOVE had taken waits in its landing zone for the sweep."""
    try:
        return _wait_select(queues, wait)
    except (redis.ConnectionError, redis.TimeoutError):
        if not any(client_info.is_cluster(q.client) for q in queues):
            raise
        time.sleep(CLUSTER_RETRY_FIRST_PAUSE_S)
        return []


def _wait_select(queues: list[ReliableQueue], wait: float) -> list[tuple[int, bytes]]:
    claims = [BlockingClaim(q) for q in queues]
    entries: list[tuple[int, bytes]] = []
    try:
        for c in claims:
            c.send(wait)
        _read_until_first(claims, entries, wait + 1.0)
        _cancel(claims, entries)
    finally:
        for c in claims:
            c.close()
    return entries


def _read_until_first(
    claims: list[BlockingClaim], entries: list[tuple[int, bytes]], limit_s: float
) -> None:
    """Read replies until one is an entry, every queue answered nil, or ``limit_s``."""
    deadline = time.monotonic() + limit_s
    index = {id(c): i for i, c in enumerate(claims)}
    with selectors.DefaultSelector() as sel:
        for c in claims:
            sel.register(c.sock, selectors.EVENT_READ, c)
        ready = [c for c in claims if c.waiting and c.buffered()]
        while True:
            for c in ready:
                sel.unregister(c.sock)  # before the read, which closes it on an error
                entry = c.read()
                if entry is not None:
                    entries.append((index[id(c)], entry))
            if entries or not any(c.waiting for c in claims):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # A TLS socket may turn readable with no reply to read yet.
            ready = [c for key, _ in sel.select(left) if (c := key.data).waiting and c.buffered()]


def _cancel(claims: list[BlockingClaim], entries: list[tuple[int, bytes]]) -> None:
    """Unblock the BLMOVEs still waiting (one pipelined CLIENT UNBLOCK per server) and
    collect what they return (nil or an entry)."""
    pending = [(i, c) for i, c in enumerate(claims) if c.waiting and c.client_id is not None]
    by_client: dict[int, list[BlockingClaim]] = {}
    for _, c in pending:
        by_client.setdefault(id(c.client), []).append(c)
    refused: set[int] = set()
    for group in by_client.values():
        pipe = group[0].client.pipeline(transaction=False)
        for c in group:
            pipe.execute_command("CLIENT", "UNBLOCK", c.client_id)
        try:
            pipe.execute()
        except redis.ResponseError:  # no permission: those connections get closed
            refused.update(id(c) for c in group)
    for i, c in pending:
        if id(c) in refused:
            c.client_id = None
        entry = c.cancel(unblock=lambda _id: None)  # unblocked above: just read the answer
        if entry is not None:
            entries.append((i, entry))
