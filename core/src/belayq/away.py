"""Queues whose Redis Cluster node is away, for a consumer of queues on several nodes.

:func:`belayq.claim_any` over queues on several cluster nodes serves the queues whose
nodes answer while one node is away (its master killed and not yet replaced, a failover
under way, ``CLUSTERDOWN``, a slot that stays redirected). A queue whose try failed is
*away*: it is skipped, and looked at again after a pause that doubles from
``CLUSTER_RETRY_FIRST_PAUSE_S`` to ``CLUSTER_RETRY_MAX_PAUSE_S``. A look costs the node
little: one ``CLUSTER SLOTS`` to a node that answers (the slot map is learned again only
when the slot has another owner now) and a TCP connection to the slot's owner; only when
that connection opens is the queue tried again. The state is kept per queue object, so it
outlives one call: a consumer calls ``claim_any`` in a loop.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
import weakref
from collections.abc import Sequence
from typing import Any

from .constants import CLUSTER_RETRY_FIRST_PAUSE_S, CLUSTER_RETRY_MAX_PAUSE_S
from .errors import (
    CLIENT_ERROR,
    CLUSTER_ERROR,
    CONNECTION_ERROR,
    REDIRECTS,
    ConnectionLost,
)
from .queue import ReliableQueue
from .scripts import refresh_slots

log = logging.getLogger("belayq")

PROBE_TIMEOUT_S = 0.2
"""How long a look at an away queue's node waits for a TCP connection (s): a node that
drops packets rather than refusing them costs the consumer no more than this per look."""

Errors = tuple[type[BaseException], ...]

#: What a queue's cluster node answers while it is away: refused or dropped connections,
#: no slot owner, a slot that stays redirected.
NODE_AWAY: Errors = (*CONNECTION_ERROR, *CLUSTER_ERROR, *REDIRECTS)

#: A look at a node that failed: refused, timed out, or no node serves the slot.
_PROBE_FAILED: Errors = (OSError, *CLIENT_ERROR, *CLUSTER_ERROR)
_ASK_FAILED: Errors = (OSError, *CLIENT_ERROR)


@dataclasses.dataclass
class _Away:
    since: float  # monotonic s of the first failed try in a row
    pause: float  # s until the next look, doubled after each failed one
    look_at: float  # monotonic s
    why: str


_AWAY: weakref.WeakKeyDictionary[ReliableQueue, _Away] = weakref.WeakKeyDictionary()


def resting(q: ReliableQueue) -> bool:
    """Whether ``q`` is away and not to be looked at yet."""
    state = _AWAY.get(q)
    return state is not None and time.monotonic() < state.look_at


def is_away(q: ReliableQueue) -> bool:
    return q in _AWAY


def went_away(q: ReliableQueue, why: object) -> None:
    """Note a failed try or look: skip ``q`` until its next look, after a longer pause."""
    now = time.monotonic()
    state = _AWAY.get(q)
    if state is None:
        state = _AWAY[q] = _Away(now, CLUSTER_RETRY_FIRST_PAUSE_S, now, str(why))
        log.warning(
            "queue %s: its cluster node cannot be reached (%s); claiming from the other "
            "queues meanwhile, and looking at it again every %.1f s at most",
            q.name, why, CLUSTER_RETRY_MAX_PAUSE_S,
        )  # fmt: skip
    else:
        state.pause = min(state.pause * 2, CLUSTER_RETRY_MAX_PAUSE_S)
        state.why = str(why)
    state.look_at = now + state.pause


def came_back(q: ReliableQueue) -> None:
    """Note a try of ``q`` that worked."""
    state = _AWAY.pop(q, None)
    if state is not None:
        log.warning(
            "queue %s: its cluster node answers again, after %.1f s",
            q.name, time.monotonic() - state.since,
        )  # fmt: skip


def give_up_if_all_away(queues: Sequence[ReliableQueue]) -> None:
    """Raise ConnectionLost when every queue has been away for longer than its
    ``cluster_retry_ms``; the next call tries them all afresh."""
    now = time.monotonic()
    states = [_AWAY.get(q) for q in queues]
    if any(s is None or now - s.since < q.config.cluster_retry_ms / 1000
           for q, s in zip(queues, states, strict=True)):  # fmt: skip
        return
    for q in queues:
        _AWAY.pop(q, None)
    waited_ms = max(q.config.cluster_retry_ms for q in queues)
    why = states[0].why if states[0] is not None else ""
    raise ConnectionLost(
        f"no queue's cluster node could be reached for {waited_ms} ms (a failover that does "
        f"not finish?): {why}"
    )


def next_look(queues: Sequence[ReliableQueue]) -> float | None:
    """When the next away queue is to be looked at (monotonic s); None when none is away."""
    looks = [s.look_at for q in queues if (s := _AWAY.get(q)) is not None]
    return min(looks) if looks else None


def look(q: ReliableQueue) -> bool:
    """Whether away ``q`` may be tried again: its slot's owner (learned again if it
    changed) accepts a TCP connection. If not, its next look is put off."""
    _follow_slot(q)
    try:
        node = q.client.get_node_from_key(q.keys.ready)
        with socket.create_connection((node.host, node.port), timeout=PROBE_TIMEOUT_S):
            return True
    except _PROBE_FAILED as exc:
        went_away(q, exc)  # refused, timed out, or no node serves the slot
        return False


def _follow_slot(q: ReliableQueue) -> None:
    """Learn the slot map again if a node that answers says another node serves ``q``'s
    slot now (one CLUSTER SLOTS on a pooled connection; learning the whole map costs
    redis-py a new connection and five commands, so it is done only then)."""
    client: Any = q.client
    try:
        slot = int(client.keyslot(q.keys.ready))
        cached = client.get_node_from_key(q.keys.ready)
        cached_at = (str(cached.host), int(cached.port))
    except (*CLIENT_ERROR, *CLUSTER_ERROR):
        refresh_slots(client)
        return
    for node in client.get_primaries():
        if (str(node.host), int(node.port)) == cached_at:
            continue
        try:
            rows = client.get_redis_connection(node).execute_command("CLUSTER", "SLOTS")
        except _ASK_FAILED:
            continue
        for row in rows:
            if int(row[0]) <= slot <= int(row[1]):
                host = row[2][0].decode() if isinstance(row[2][0], bytes) else str(row[2][0])
                if (host, int(row[2][1])) != cached_at:
                    refresh_slots(client)
                return
        refresh_slots(client)  # no node serves the slot, says this one
        return
    refresh_slots(client)
