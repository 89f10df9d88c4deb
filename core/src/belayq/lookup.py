"""Finding a message by the ids users have, at a bounded cost (the dashboard's search and
message detail).

A message is found by belayq's id (a digest of a Celery envelope, an RQ job id, a Dramatiq
``message_id``: the id its keys name), in any state, or by an id its framework gives it
inside the message (a Celery task id, the ``id`` header of a kombu envelope), which the
adapter's kind module reads (``ids_of``, :mod:`belayq.kinds`). What is searched, and how far:

1. belayq's id in every state but ready, and in ready too where the queue keeps payloads
   beside its lists (belayq's own, Dramatiq's): one pipeline of O(1) commands.
2. belayq's id in the ready lists whose entries are the ids (RQ's job ids): ``LPOS`` from each
   end of each list, each comparing at most :data:`LPOS_MAXLEN` entries.
3. A digest of an entry, or a framework's id, in the ready lists whose entries are the
   messages (kombu's envelopes): the :data:`WINDOW` entries at each end of each list.
4. A framework's id among the :data:`WINDOW` soonest-to-expire claims, soonest-due delayed
   messages and newest dead letters, and (of a queue whose entries are ids, as Dramatiq's)
   the :data:`WINDOW` at each end of each ready list: their payloads read :data:`STEP` per
   command (``LRANGE``, ``ZRANGE``, ``HMGET``).

No command scans a whole backlog: a message beyond those windows is not found (a search
says where it looked). Read only: nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .blocking import node_client
from .kinds import tools_for
from .models import entry_id
from .models import text as _text
from .queue import ReliableQueue

#: Entries one ``LPOS`` compares at most, from each end of a ready list.
LPOS_MAXLEN = 10_000
#: Entries at each end of a ready list, and members of each of the in-flight, delayed and
#: dead sets, read for an id held inside the messages.
WINDOW = 1_000
#: Entries or payloads read per command while reading a window.
STEP = 200

IdsOf = Callable[[bytes], list[str]]


def ids_reader(kind: str) -> IdsOf | None:
    """The adapter's reader of its framework's ids in a payload (``ids_of``), or None."""
    reader: IdsOf | None = getattr(tools_for(kind), "ids_of", None)
    return reader


def locate(q: ReliableQueue, wanted: str) -> tuple[str, bytes | None] | None:
    """The message of ``q`` (one queue, or one shard) that ``wanted`` names, as belayq's id
    and, for a waiting message whose list entry is its payload, that entry; None when the
    searched windows (see the module doc) hold none."""
    if _known(q, wanted):
        return wanted, None
    inline = q.config.payload_in_list
    if inline and _listed(q, wanted):
        return wanted, wanted.encode()
    ids_of = ids_reader(q.kind)
    if inline and (ids_of is not None or _digest(wanted)):
        found = _in_ready_windows(q, wanted, ids_of)
        if found is not None:
            return found
    if ids_of is not None:
        held = _in_sets(q, wanted, ids_of)
        if held is not None:
            return held, None
    return None


def _digest(wanted: str) -> bool:
    """Whether ``wanted`` may be the digest of a list entry (a SHA-1, in hex)."""
    return len(wanted) == 40 and all(c in "0123456789abcdef" for c in wanted)


def _known(q: ReliableQueue, wanted: str) -> bool:
    k = q.keys
    pipe = node_client(q).pipeline(transaction=False)
    pipe.hexists(k.meta, wanted)
    pipe.hexists(k.payloads, wanted)
    pipe.zscore(k.leases, wanted)
    pipe.zscore(k.delayed, wanted)
    pipe.zscore(k.dead, wanted)
    return any(bool(r) if isinstance(r, bool) else r is not None for r in pipe.execute())


def _listed(q: ReliableQueue, wanted: str) -> bool:
    """Whether an entry of a ready list is ``wanted`` itself, among the
    :data:`LPOS_MAXLEN` at each end (an entry longer than an id never is one)."""
    if len(wanted) > 64:
        return False
    pipe = node_client(q).pipeline(transaction=False)
    for level in q.keys.levels:
        pipe.lpos(level, wanted, rank=1, maxlen=LPOS_MAXLEN)
        pipe.lpos(level, wanted, rank=-1, maxlen=LPOS_MAXLEN)
    return any(r is not None for r in pipe.execute())


def _windows(length: int) -> list[tuple[int, int]]:
    """(start, end) of the ``LRANGE`` reads of a list of ``length``: its first and last
    :data:`WINDOW` entries (all of it when shorter), :data:`STEP` at a time."""
    spans = [(0, min(length, WINDOW))]
    if length > WINDOW:
        spans.append((max(WINDOW, length - WINDOW), length))
    return [(i, min(i + STEP, end) - 1) for start, end in spans for i in range(start, end, STEP)]


def _ready_windows(q: ReliableQueue) -> list[bytes]:
    """The entries of the ready lists within :data:`WINDOW` of either end."""
    client = node_client(q)
    levels = q.keys.levels
    pipe = client.pipeline(transaction=False)
    for level in levels:
        pipe.llen(level)
    lengths = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for level, length in zip(levels, lengths, strict=True):
        for start, end in _windows(int(length)):
            pipe.lrange(level, start, end)
    return [bytes(entry) for entries in pipe.execute() for entry in entries]


def _in_ready_windows(q: ReliableQueue, wanted: str,
                      ids_of: IdsOf | None) -> tuple[str, bytes] | None:
    """A waiting message of a queue whose entries are the payloads, named by ``wanted``
    as the digest of its entry or as its framework's id."""
    for raw in _ready_windows(q):
        if entry_id(raw, True) == wanted or (ids_of is not None and wanted in ids_of(raw)):
            return entry_id(raw, True), raw
    return None


def _in_sets(q: ReliableQueue, wanted: str, ids_of: IdsOf) -> str | None:
    """belayq's id of the message whose payload holds ``wanted`` as its framework's id,
    among the first :data:`WINDOW` of the claimed, delayed and dead sets (and, of a queue
    whose entries are ids, of each end of its ready lists)."""
    k = q.keys
    client = node_client(q)
    pipe = client.pipeline(transaction=False)
    pipe.zrange(k.leases, 0, WINDOW - 1)
    pipe.zrange(k.delayed, 0, WINDOW - 1)
    pipe.zrevrange(k.dead, 0, WINDOW - 1)
    ids = [_text(i) for members in pipe.execute() for i in members]
    if not q.config.payload_in_list:
        ids += [_text(entry) for entry in _ready_windows(q)]
    for start in range(0, len(ids), STEP * 5):
        pipe = client.pipeline(transaction=False)
        chunk = ids[start:start + STEP * 5]
        for i in range(0, len(chunk), STEP):
            pipe.hmget(k.payloads, chunk[i:i + STEP])
        payloads = [p for batch in pipe.execute() for p in batch]
        for message_id, payload in zip(chunk, payloads, strict=True):
            if payload is not None and wanted in ids_of(bytes(payload)):
                return message_id
    return None


def framework_ids(kind: str, payload: Any) -> list[str]:
    """The framework's ids of a message of ``kind`` held in ``payload`` ([] when none)."""
    ids_of = ids_reader(kind)
    if ids_of is None or payload is None:
        return []
    return ids_of(bytes(payload))
