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

TLS connections are waited on the same way. A TLS connection may hold reply bytes that a
select no longer sees (taken off the socket and decrypted, or in redis-py's read buffer),
so before each select every connection is asked whether a reply can be read now
(:meth:`BlockingClaim.buffered`), and after a select only the connections that say so are
read.

No entry is ever only in this process's memory: between the BLMOVE and its lease an entry
sits in a processing list, where the sweep gives it a provisional lease and returns it
after ``lease_ms`` if this process dies. A connection that cannot be unblocked (no
permission for CLIENT UNBLOCK, an error mid-way) is closed instead, with the same
guarantee.

On Redis Cluster the same is done with the connection pool of each queue's node (all keys
of one queue share a slot), and each node fails on its own (:mod:`belayq.away`): a queue
whose node cannot be reached is skipped and looked at again now and then, while the other
queues are claimed from and blocked on as usual; their blocked round goes on through a
look that finds the node still away. A BLMOVE answered by a redirection (MOVED/ASK,
UNBLOCKED after a failover) ends the round as if nothing came, and the next try re-routes.
``ConnectionLost`` is raised only when every queue has been away for longer than its
``cluster_retry_ms``. An entry whose BLMOVE answered just before its node went away waits
in that node's landing zone for the sweep.

fakeredis (its blocking commands return at once) gets a slower but correct fallback: a
non-blocking try of every queue, then a sleep of ``FALLBACK_SLICE_S``; pickup takes up to
one slice on every queue.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Sequence

from . import away as node_away
from . import client_info
from .away import NODE_AWAY, Errors
from .blocking import BlockingClaim
from .constants import BLOCK_ROUND_MIN_S, CLAIM_ANY_ROUND_MAX_S
from .errors import (
    CONNECTION_ERROR,
    RESPONSE_ERROR,
    ConfigError,
    ConnectionLost,
    drop_connections,
    left_primary,
)
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
        ConnectionLost: Redis could not be reached (on a cluster: no queue's node could,
            for longer than ``cluster_retry_ms``).
    """
    if not queues:
        raise ConfigError("claim_any needs at least one queue")
    if len({q.keys.ready for q in queues}) != len(queues):
        raise ConfigError("claim_any got the same queue more than once")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"count must be an int >= 1, got {count!r}")
    try:
        return _claim_any(list(queues), timeout, count)
    except CONNECTION_ERROR as exc:
        raise ConnectionLost(f"Redis unreachable during claim_any: {exc}") from exc
    except RESPONSE_ERROR as exc:
        if not left_primary(exc):
            raise
        for q in queues:
            drop_connections(q.client)
        raise ConnectionLost(f"the server left the primary role during claim_any: {exc}") from exc


def _claim_any(queues: list[ReliableQueue], timeout: float | None, count: int) -> list[Delivery]:
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    fake = any(type(q.client).__module__.split(".")[0] == "fakeredis" for q in queues)
    # On a cluster a node that is away costs only its own queues (see the module notes).
    away: Errors = NODE_AWAY if any(client_info.is_cluster(q.client) for q in queues) else ()
    if not fake and not away and len(queues) == 1:
        return queues[0].claim(timeout, count)
    while True:
        got, due_ms = _try_each(queues, count, away)
        if got or timeout == 0:
            return got
        wait = CLAIM_ANY_ROUND_MAX_S if deadline is None else deadline - time.monotonic()
        if wait <= 0:
            return []
        wait = min(wait, CLAIM_ANY_ROUND_MAX_S)
        if due_ms >= 0:  # a delayed message falls due: try again then
            wait = min(wait, max(due_ms, 1) / 1000)
        if fake:
            time.sleep(min(wait, FALLBACK_SLICE_S))
            continue
        got = _lease_all(queues, _wait_select(queues, wait, away), count, away)
        if got:
            return got


def _try_each(queues: list[ReliableQueue], count: int, away: Errors) -> tuple[list[Delivery], int]:
    """Non-blocking claims in priority order until ``count`` is reached, skipping the
    queues that are away until their next try."""
    got: list[tuple[ReliableQueue, Delivery]] = []
    due_ms = -1
    failed = False
    try:
        for q in queues:
            if node_away.is_away(q):
                if node_away.resting(q):
                    continue
                if not node_away.look(q):
                    failed = True
                    continue
            n = count - len(got)
            try:
                more, due = q.try_claim(n, patient=False) if away else q.try_claim(n)
            except away as exc:
                node_away.went_away(q, exc)
                failed = True
                continue
            node_away.came_back(q)
            got.extend((q, d) for d in more)
            if due >= 0:
                due_ms = due if due_ms < 0 else min(due_ms, due)
            if len(got) >= count:
                break
    except BaseException:
        _give_back(got)
        raise
    if failed and not got:
        node_away.give_up_if_all_away(queues)
    return [d for _, d in got], due_ms


def _lease_all(
    queues: list[ReliableQueue], entries: list[tuple[int, bytes]], count: int, away: Errors
) -> list[Delivery]:
    """Lease every BLMOVE-d entry (highest priority first); hand back what exceeds count."""
    got: list[tuple[ReliableQueue, Delivery]] = []
    try:
        for i, entry in sorted(entries, key=lambda e: e[0]):
            q = queues[i]
            try:
                reply = q.lease_claimed(entry, patient=False) if away else q.lease_claimed(entry)
                leased = reply[0]
            except away as exc:  # the entry waits in the node's landing zone for the sweep
                node_away.went_away(q, exc)
                continue
            got.extend((q, d) for d in leased)
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


# -- waiting on every queue at once -----------------------------------------------------------


Claims = list[tuple[int, BlockingClaim]]  # (the queue's position, its claim)


def _wait_select(queues: list[ReliableQueue], wait: float, away: Errors) -> list[tuple[int, bytes]]:
    """BLMOVE on every queue that is not away; the entries of the first reply(ies)."""
    claims: Claims = []
    entries: list[tuple[int, bytes]] = []
    try:
        for i, q in enumerate(queues):
            if node_away.is_away(q):  # tried again by the next round, once a look says so
                continue
            c = BlockingClaim(q)
            claims.append((i, c))
            try:
                c.send(wait)
            except away as exc:
                node_away.went_away(q, exc)
        waiting = [(i, c) for i, c in claims if c.waiting]
        if not waiting:  # every queue is away: wait for the next look
            look_at = node_away.next_look(queues)
            left = wait if look_at is None else look_at - time.monotonic()
            time.sleep(max(BLOCK_ROUND_MIN_S, min(wait, left)))
            return entries
        _read_until_first(waiting, entries, wait + 1.0, queues, away)
        _cancel(waiting, entries, away)
    finally:
        for _, c in claims:
            c.close()
    return entries


def _with_reply(claims: Claims, away: Errors) -> Claims | None:
    """The claims whose reply can be read now; None when one's node went away."""
    out: Claims = []
    for i, c in claims:
        try:
            if c.waiting and c.buffered():
                out.append((i, c))
        except away as exc:
            node_away.went_away(c.queue, exc)
            return None
    return out


def _read_until_first(
    claims: Claims,
    entries: list[tuple[int, bytes]],
    limit_s: float,
    queues: list[ReliableQueue],
    away: Errors,
) -> None:
    """Read replies until one is an entry, every queue answered nil, ``limit_s`` passed,
    or (on a cluster) a queue's node went away, redirected it, or came back."""
    deadline = time.monotonic() + limit_s
    with selectors.DefaultSelector() as sel:
        for i, c in claims:
            sel.register(c.sock, selectors.EVENT_READ, (i, c))
        ready = _with_reply(claims, away)
        while ready is not None:
            for i, c in ready:
                sel.unregister(c.sock)  # before the read, which closes it on an error
                try:
                    entry = c.read()
                except away as exc:
                    node_away.went_away(c.queue, exc)
                    return
                if entry is not None:
                    entries.append((i, entry))
                elif away and c.redirected:  # the slot is served elsewhere: re-route
                    return
            if entries or not any(c.waiting for _, c in claims):
                return
            now = time.monotonic()
            look_at = node_away.next_look(queues) if away else None
            if look_at is not None and look_at <= now:
                if _any_back(queues):  # a new round tries it (and blocks on it)
                    return
                continue
            left = deadline - now if look_at is None else min(deadline, look_at) - now
            if deadline <= now:
                return
            ready = _with_reply([key.data for key, _ in sel.select(left)], away)


def _any_back(queues: list[ReliableQueue]) -> bool:
    """Look at the away queues that are due; whether one may be tried again."""
    due = [q for q in queues if node_away.is_away(q) and not node_away.resting(q)]
    return any([node_away.look(q) for q in due])  # a list: every due queue is looked at


def _cancel(claims: Claims, entries: list[tuple[int, bytes]], away: Errors) -> None:
    """Unblock the BLMOVEs still waiting (one pipelined CLIENT UNBLOCK per server) and
    collect what they return (nil or an entry)."""
    pending = [(i, c) for i, c in claims if c.waiting and c.client_id is not None]
    by_client: dict[int, list[BlockingClaim]] = {}
    for _, c in pending:
        by_client.setdefault(id(c.client), []).append(c)
    refused: set[int] = set()
    unanswered: Errors = (*RESPONSE_ERROR, *away)  # no permission, or the node is away
    for group in by_client.values():
        pipe = group[0].client.pipeline(transaction=False)
        for c in group:
            pipe.execute_command("CLIENT", "UNBLOCK", c.client_id)
        try:
            pipe.execute()
        except unanswered:
            refused.update(id(c) for c in group)  # those connections get closed instead
    for i, c in pending:
        if id(c) in refused:
            c.client_id = None
        try:
            entry = c.cancel(unblock=lambda _id: None)  # unblocked above: read the answer
        except away as exc:
            node_away.went_away(c.queue, exc)
            continue
        if entry is not None:
            entries.append((i, entry))
