"""Values the core hands out: deliveries, dead letters, sweep results."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


def text(value: Any) -> str:
    """A reply field as text (ids, tokens and states are ASCII; anything else is escaped)."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def entry_id(entry: bytes, inline: bool) -> str:
    """The id of the message a ready-list entry holds: in a queue whose lists hold the
    payloads (``payload_in_list``), a short printable-ASCII entry (an RQ job id) is its own
    id and any other goes by its SHA-1, as the scripts name it; else the entry is the id."""
    if inline and (len(entry) > 64 or not entry or any(c < 33 or c > 126 for c in entry)):
        return hashlib.sha1(entry).hexdigest()
    return text(entry)


@dataclass(frozen=True)
class Delivery:
    """One claim of one message.

    Attributes:
        id: The message id. In inline mode: the list entry itself when it is short
            printable ASCII (an RQ job id), else the SHA1 of the entry; a copy of an entry
            whose id another copy holds (held, delayed or dead) gets ``"<id> #<n>"``.
        payload: The message bytes.
        token: The fencing token of this claim; settle calls must present it.
        deliveries: How many times the message has been claimed, 1 on the first claim.
        queue: The name of the queue it was claimed from.
        attempts: How many runs of the message have started, this claim included when it
            counts as started (``claim_starts``); runs of claims whose holder died before
            starting them are not counted.
        exhausted: The message had already run ``max_deliveries`` times before this claim
            (only with ``exhausted="deliver"``): record its failure and ack it; do not run
            it.
        shard: The name of the shard it was claimed from, when ``queue`` is a
            :class:`~belayq.ShardedQueue` (whose settle calls route by it); ``""`` otherwise.
        claimed_s: When the claim was taken (``time.time()`` of the claiming process; 0 for
            a Delivery built by hand): the run time of the metrics is measured from it.
    """

    id: str
    payload: bytes
    token: str
    deliveries: int
    queue: str
    attempts: int = 0
    exhausted: bool = False
    shard: str = ""
    claimed_s: float = field(default=0.0, compare=False, repr=False)


@dataclass(frozen=True)
class Published:
    """What one publish did.

    Attributes:
        id: The message id (a deduplicated publish: the first message's id).
        stored: False when a ``dedup_id`` suppressed the message: nothing was stored.
        state: For a deduplicated publish, where the first message is now: ``"ready"``,
            ``"delayed"``, ``"in_flight"``, ``"dead"``, ``"gone"`` (settled or purged) or
            ``"unknown"`` (inline queues cannot tell ready from gone); ``""`` when stored.
    """

    id: str
    stored: bool
    state: str


@dataclass(frozen=True)
class DeadLetter:
    """A message in the dead-letter set.

    Attributes:
        id: The message id.
        payload: The message bytes, or None when the payload itself was missing.
        reason: Why it was dead-lettered.
        deliveries: How many times it had been claimed.
        dead_at_ms: When it was dead-lettered (ms, server clock).
        attempts: How many of those claims had started running.
    """

    id: str
    payload: bytes | None
    reason: str
    deliveries: int
    dead_at_ms: int
    attempts: int = 0


@dataclass(frozen=True)
class HistoryRecord:
    """A finished message in the queue's history (``history_max``).

    Attributes:
        id: The message id.
        outcome: ``"done"`` (acked) or ``"failed"`` (dead-lettered).
        result: What the ack passed (``""`` when nothing, or for a failed one).
        reason: Why it was dead-lettered (``""`` for a done one).
        deliveries: How many times it was claimed.
        attempts: How many of those runs started.
        published_ms: When it was published (ms): on the server's clock for a delayed
            message; read from the id (the producer's clock) for one published ready; 0 when
            unknown (a message a foreign producer pushed straight onto the list).
        finished_ms: When it was acked or dead-lettered (ms, server clock).
        payload: The first bytes of the payload (up to 1 KiB).
    """

    id: str
    outcome: str
    result: str
    reason: str
    deliveries: int
    attempts: int
    published_ms: int
    finished_ms: int
    payload: bytes


@dataclass(frozen=True)
class Lease:
    """A claim held now (:meth:`~belayq.ReliableQueue.in_flight`).

    Attributes:
        id: The message id.
        deadline_ms: When its lease runs out (ms, server clock).
        deliveries: How many times it has been claimed.
        attempts: How many of those runs started.
        started: Whether its holder started this run.
        provisional: A lease the sweep gave an entry whose claimer has not leased it yet.
        token: The claim's fencing token.
        host: The holder's host name; ``""`` when unknown (the claim was made before its
            consumer registered, the record was dropped, or the lease is provisional).
        pid: The holder's process id; 0 when unknown.
    """

    id: str
    deadline_ms: int
    deliveries: int
    attempts: int
    started: bool
    provisional: bool
    token: str
    host: str
    pid: int

    @property
    def holder(self) -> str:
        """``"host:pid"``, or ``""`` when the holder is unknown."""
        return f"{self.host}:{self.pid}" if self.host else ""


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did.

    Attributes:
        ran: Always True (kept for callers of the guarded sweep of schema 1).
        reclaimed: Expired leases put back to ready.
        dead_lettered: Messages dead-lettered because they ran out of runs (attempts).
        adopted: Lease-less claims (claimer died after BLMOVE) put back to ready.
        promoted: Delayed messages that became ready.
        orphans_found: Entries found in the landing zone with no lease (given a provisional
            lease this time).
    """

    ran: bool
    reclaimed: int
    dead_lettered: int
    adopted: int
    promoted: int
    orphans_found: int
