"""Claim from several queues in priority order, waiting on all of them at once.

BLMOVE takes one source list and cannot run inside Lua, so a consumer of several queues
cannot block on them with one command. :func:`claim_any` first tries each queue in
priority order with :meth:`ReliableQueue.try_claim` (one script each, no gap); when all
are empty it blocks on every queue at the same time, with no polling:

1. one pooled connection per queue sends ``CLIENT ID`` and the queue's
   :meth:`~ReliableQueue.blmove_command`, pipelined;
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

Clients without plain TCP or Unix sockets fall back to something slower but correct:

* TLS connections: BLMOVE on the highest-priority queue in slices of ``FALLBACK_SLICE_S``
  and a non-blocking try of every queue between slices. Pickup is immediate on the first
  queue; on the others it waits for the slice to end, which Redis rounds up to its timer
  period (100 ms at the default ``hz 10``).
* fakeredis (its blocking commands return at once): a non-blocking try of every queue,
  then a sleep of ``FALLBACK_SLICE_S``; pickup takes up to one slice on every queue.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Sequence
from typing import Any

import redis

from . import client_info
from .errors import ConfigError, ConnectionLost
from .models import Delivery
from .queue import ReliableQueue

FALLBACK_SLICE_S = 0.05
"""Longest wait of one fallback round (s): the pickup latency of the slower paths."""

_ROUND_CAP_S = 60.0  # one blocking round at most; a dead socket cannot hang us for longer
_CANCEL_GRACE_S = 5.0  # how long an unblocked connection may take to answer


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


def _claim_any(queues: list[ReliableQueue], timeout: float | None, count: int) -> list[Delivery]:
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    mode = _wait_mode(queues)
    if mode == "select" and len(queues) == 1 and not client_info.is_cluster(queues[0].client):
        return queues[0].claim(timeout, count)
    while True:
        got, due_ms = _try_each(queues, count)
        if got or timeout == 0:
            return got
        wait = _ROUND_CAP_S if deadline is None else deadline - time.monotonic()
        if wait <= 0:
            return []
        wait = min(wait, _ROUND_CAP_S)
        if due_ms >= 0:  # a delayed message falls due: try again then
            wait = min(wait, max(due_ms, 1) / 1000)
        if mode == "select":
            entries = _wait_select(queues, wait)
        elif mode == "slices":
            entries = _wait_first(queues[0], min(wait, FALLBACK_SLICE_S))
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
    """``select`` (plain sockets), ``slices`` (TLS) or ``sleep`` (fakeredis)."""
    modes = set()
    for q in queues:
        client = q.client
        if type(client).__module__.split(".")[0] == "fakeredis":
            modes.add("sleep")
        elif client_info.is_cluster(client):
            tls = bool(client_info.connection_kwargs(client).get("ssl"))
            modes.add("slices" if tls else "select")
        else:
            conn_class = getattr(client.connection_pool, "connection_class", None)
            tls = conn_class is not None and "SSL" in conn_class.__name__
            modes.add("slices" if tls else "select")
    for mode in ("sleep", "slices"):
        if mode in modes:
            return mode
    return "select"


def _node_client(q: ReliableQueue) -> Any:
    """The client of the server that holds ``q``'s keys (the queue's own client, or on a
    cluster the client of the node that serves its slot)."""
    client = q.client
    if client_info.is_cluster(client):
        node = client.get_node_from_key(q.keys.ready)
        return client.get_redis_connection(node)
    return client


def _wait_first(q: ReliableQueue, wait: float) -> list[tuple[int, bytes]]:
    entry = q.client.execute_command(*q.blmove_command(wait))
    return [] if entry is None else [(0, bytes(entry))]


class _Waiter:
    """One queue's blocked BLMOVE on a connection of its own."""

    def __init__(self, index: int, queue: ReliableQueue) -> None:
        self.index = index
        self.queue = queue
        self.client: Any = _node_client(queue)
        self.pool: Any = self.client.connection_pool
        self.conn: Any = None
        self.client_id: int | None = None
        self.pending = False  # a BLMOVE reply is still to be read

    def start(self, wait: float) -> None:
        try:
            self.conn = self.pool.get_connection()
        except TypeError:  # redis-py < 5.3 wants a command name
            self.conn = self.pool.get_connection("BLMOVE")
        cmds = [("CLIENT", "ID"), self.queue.blmove_command(wait)]
        self.conn.send_packed_command(self.conn.pack_commands(cmds))
        self.pending = True
        try:
            self.client_id = int(self.conn.read_response())
        except redis.ResponseError:  # no permission: this one gets closed, not unblocked
            self.client_id = None

    @property
    def sock(self) -> socket.socket:
        sock: socket.socket = self.conn._sock
        return sock

    def buffered(self) -> bool:
        return bool(self.conn.can_read(timeout=0))

    def read(self) -> bytes | None:
        try:
            reply = self.conn.read_response()
        except redis.ResponseError:  # MOVED/ASK mid-resharding: the next try re-routes
            reply = None
        self.pending = False
        return None if reply is None else bytes(reply)

    def finish(self) -> None:
        """Return the connection to its pool; close it first if a reply is outstanding."""
        if self.conn is None:
            return
        if self.pending:
            self.conn.disconnect()
        self.pool.release(self.conn)
        self.conn = None


def _wait_select(queues: list[ReliableQueue], wait: float) -> list[tuple[int, bytes]]:
    waiters = [_Waiter(i, q) for i, q in enumerate(queues)]
    entries: list[tuple[int, bytes]] = []
    try:
        for w in waiters:
            w.start(wait)
        _read_until_first(waiters, entries, wait + 1.0)
        _cancel(waiters, entries)
    finally:
        for w in waiters:
            w.finish()
    return entries


def _read_until_first(
    waiters: list[_Waiter], entries: list[tuple[int, bytes]], limit_s: float
) -> None:
    """Read replies until one is an entry, every queue answered nil, or ``limit_s``."""
    deadline = time.monotonic() + limit_s
    with selectors.DefaultSelector() as sel:
        for w in waiters:
            sel.register(w.sock, selectors.EVENT_READ, w)
        while not entries and any(w.pending for w in waiters):
            ready = [w for w in waiters if w.pending and w.buffered()]
            if not ready:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                ready = [key.data for key, _ in sel.select(left)]
            for w in ready:
                if not w.pending:
                    continue
                entry = w.read()
                sel.unregister(w.sock)
                if entry is not None:
                    entries.append((w.index, entry))


def _cancel(waiters: list[_Waiter], entries: list[tuple[int, bytes]]) -> None:
    """Unblock the BLMOVEs still waiting and collect what they return (nil or an entry)."""
    pending = [w for w in waiters if w.pending and w.client_id is not None]
    by_client: dict[int, list[_Waiter]] = {}
    for w in pending:
        by_client.setdefault(id(w.client), []).append(w)
    for group in by_client.values():
        pipe = group[0].client.pipeline(transaction=False)
        for w in group:
            pipe.execute_command("CLIENT", "UNBLOCK", w.client_id)
        try:
            pipe.execute()
        except redis.ResponseError:  # no permission: those connections get closed
            for w in group:
                w.client_id = None
    for w in pending:
        if w.client_id is not None and w.conn.can_read(timeout=_CANCEL_GRACE_S):
            entry = w.read()
            if entry is not None:
                entries.append((w.index, entry))
