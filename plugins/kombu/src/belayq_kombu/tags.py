"""Which core claim each kombu delivery tag stands for, and settling them through the core.

A kombu delivery tag is minted per claim (``<token>.<queue>``), so two copies of one message
can never settle each other's lease. The table is shared by the channels of a transport:
kombu routes a delivery to whichever channel registered the queue's callback.

Settling never loses a message:

* a settlement (ack, nack, dead letter, deferral) that cannot reach Redis is retried by the
  core's lease keeper, which keeps the claim alive meanwhile (``ReliableQueue.retry_later``),
  instead of being dropped as kombu would (see :func:`settle`);
* a settlement Redis refused, and claims a closed channel could not hand back, are
  abandoned: the keeper stops extending them and the sweep returns them after the lease. No
  claim is ever kept alive with nobody to settle it;
* when a channel closes under running Celery tasks (a connection blip), their claims are kept
  and extended until the task settles them, so a blip never runs a task twice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from belayq import Delivery, ReliableQueue
from belayq.errors import ConnectionLost, DurabilityError
from belayq.sent import Answer

from . import celery_state
from .kept import ALL_TAGS, Kept

log = logging.getLogger("belayq.kombu")

Claim = tuple[ReliableQueue, Delivery]

#: Acks sent without waiting whose answers may stay unread (each holds a connection of
#: the pool until read); beyond this the oldest is read, waiting for it.
UNREAD_MAX = 2

#: Acks of one queue sent without waiting, and their answer.
SentAcks = tuple[ReliableQueue, list[Delivery], Answer[list[bool]]]


def tag_of(queue: str, delivery: Delivery) -> str:
    """The kombu delivery tag of one claim: unique per claim in the process."""
    return f"{delivery.token}.{queue}"


def abandon(rq: ReliableQueue, deliveries: Iterable[Delivery]) -> None:
    """Stop extending these claims; the sweep returns them once their lease runs out."""
    rq.forget(list(deliveries))


def give_back(rq: ReliableQueue, deliveries: list[Delivery]) -> int:
    """Hand unstarted claims back to the front of their queue (uncounted); returns how many.
    Claims that cannot be handed back (Redis unreachable, or refusing) are abandoned: the
    sweep brings them back after their lease, and nothing is lost."""
    if not deliveries:
        return 0
    try:
        return rq.release(deliveries)
    except Exception:
        log.warning("could not release %d message(s) of %s; they return after their lease",
                    len(deliveries), rq.name, exc_info=log.isEnabledFor(logging.DEBUG))
        abandon(rq, deliveries)
        return 0


class Tags:
    """Delivery tag -> claim, for one transport; thread-safe (acks come from any thread)."""

    def __init__(self) -> None:
        self._claims: dict[Any, Claim] = {}
        self._reported: set[Any] = set()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._deferred: list[Claim] = []
        #: Acks sent by :meth:`flush` whose answers are not read yet.
        self._sent: list[SentAcks] = []
        self.kept = Kept(self)
        ALL_TAGS.add(self)
        #: Acks made on this thread are sent in one script by :meth:`flush`, which the
        #: poller calls before it reads or claims again: at the next tick of the event
        #: loop (the same loop iteration) or at the end of drain_events.
        self.defer_thread: int | None = None

    def add(self, tag: Any, rq: ReliableQueue, delivery: Delivery) -> None:
        with self._lock:
            self._claims[tag] = (rq, delivery)

    def get(self, tag: Any) -> Claim | None:
        with self._lock:
            return self._claims.get(tag)

    def pop(self, tag: Any) -> Claim | None:
        with self._lock:
            claim = self._claims.pop(tag, None)
            self._reported.discard(tag)
            return claim

    def report_starts(self) -> None:
        """Tell the core which claims Celery's pool has accepted: their runs count as
        attempts from now on. Each pool reports its starts before the task runs (see
        :mod:`.starts`); this tick of the main process reports any that could not reach
        Redis then (one script per queue, only on a tick that found new starts; with Redis
        away, the reports ride on the lease keeper's next extend). Tags only prefetched (or
        held for their ETA) stay unstarted, so a worker that dies holding them does not move
        them toward the dead-letter set."""
        running = celery_state.running_tags()
        by_queue: dict[ReliableQueue, list[Delivery]] = defaultdict(list)
        with self._lock:
            for tag in running - self._reported:
                claim = self._claims.get(tag)
                if claim is not None:
                    by_queue[claim[0]].append(claim[1])
                    self._reported.add(tag)
        for rq, deliveries in by_queue.items():
            try:
                rq.start(deliveries, now=True)
            except ConnectionLost:
                rq.start(deliveries)

    def start_now(self, tag: Any) -> bool:
        """The task of ``tag`` starts in this very process (solo or threads pool): report
        it at once, before it runs. False when this process does not hold the claim (a
        prefork pool child: it reports the start itself, see :mod:`.starts`)."""
        if os.getpid() != self._pid:
            return False  # a forked copy of the parent's table
        with self._lock:
            claim = self._claims.get(tag)
            if claim is None:
                return False
            if tag in self._reported:
                return True
            self._reported.add(tag)
        try:
            claim[0].start([claim[1]], now=True)
        except ConnectionLost:
            claim[0].start([claim[1]])
        return True

    def __len__(self) -> int:
        return len(self._claims)

    def abandon(self, tag: Any) -> None:
        """Stop extending a claim without settling it; it comes back after its lease."""
        claim = self.pop(tag)
        if claim is not None:
            abandon(claim[0], [claim[1]])

    def ack(self, tag: Any) -> None:
        """Settle for good (now, or at the next :meth:`flush` on the polling thread)."""
        claim = self.pop(tag)
        if claim is None:
            return
        if threading.get_ident() == self.defer_thread:
            with self._lock:
                self._deferred.append(claim)
            return
        self._ack([claim])

    @property
    def pending(self) -> bool:
        """Whether acks wait for :meth:`flush`."""
        return bool(self._deferred)

    def flush(
        self, more: Mapping[ReliableQueue, int] | None = None, *, wait: bool = True
    ) -> dict[ReliableQueue, list[Delivery]]:
        """Send the deferred acks, one script per queue. For a queue in ``more``, the same
        round trip also claims up to that many waiting messages (returned, not delivered).
        Without ``wait`` (the event loop's tick) the acks are sent and their answers read
        by a later flush, once they have arrived; a flush that waits first reads every
        answer still due."""
        self.collect(wait=wait or bool(more))
        if not self._deferred:
            return {}
        with self._lock:
            batch, self._deferred = self._deferred, []
        if wait or more:
            return self._ack(batch, more or {})
        for rq, deliveries in _by_queue(batch).items():
            try:
                read = rq.send_ack_many(deliveries)
            except Exception as exc:
                _not_landed(rq, "ack", deliveries, exc)
                continue
            with self._lock:
                self._sent.append((rq, deliveries, read))
        return {}

    def collect(self, *, wait: bool = True) -> None:
        """Read the answers of the acks :meth:`flush` sent without waiting: all of them
        (``wait``), else those that have arrived, and the oldest while more than
        :data:`UNREAD_MAX` are due (each holds a connection)."""
        if not self._sent or os.getpid() != self._pid:
            return
        with self._lock:
            unread = len(self._sent)
            due: list[SentAcks] = []
            kept: list[SentAcks] = []
            for i, sent in enumerate(self._sent):
                late = wait or unread - i > UNREAD_MAX or sent[2].ready()
                (due if late else kept).append(sent)
            self._sent = kept
        for rq, deliveries, read in due:
            try:
                done = read()
            except Exception as exc:
                _not_landed(rq, "ack", deliveries, exc)
                continue
            _log_refused("ack", deliveries, done)

    @staticmethod
    def _ack(
        claims: list[Claim], more: Mapping[ReliableQueue, int] | None = None
    ) -> dict[ReliableQueue, list[Delivery]]:
        more = more or {}
        claimed: dict[ReliableQueue, list[Delivery]] = {}
        for rq, deliveries in _by_queue(claims).items():
            count = more.get(rq, 0)
            if count <= 0:
                settle(rq, "ack", deliveries)
                continue
            try:
                done, claimed[rq] = rq.ack_and_claim(deliveries, count)
            except Exception as exc:
                _not_landed(rq, "ack", deliveries, exc)
                continue
            _log_refused("ack", deliveries, done)
        return claimed

    def reject(
        self, tag: Any, *, requeue: bool, dead_letter: bool, reason: str | None = None
    ) -> None:
        """Requeue (counted delivery), dead-letter, or drop a claim (``reason``: kept with a
        dead letter or a requeued message)."""
        claim = self.pop(tag)
        if claim is None:
            return
        rq, d = claim
        if requeue:
            op, reason = "nack", reason or "rejected with requeue"
        elif dead_letter:
            op, reason = "dead", reason or "rejected without requeue"
        else:
            op, reason = "ack", ""
        settle(rq, op, [d], reason)

    def release(self, tags: Iterable[Any]) -> int:
        """Hand claims back to the front of their queues (uncounted); returns how many.

        Tags that cannot be handed back (Redis unreachable) are abandoned to the sweep.
        """
        by_queue: dict[ReliableQueue, list[Delivery]] = defaultdict(list)
        for tag in tags:
            claim = self.pop(tag)
            if claim is not None:
                by_queue[claim[0]].append(claim[1])
        return sum(give_back(rq, deliveries) for rq, deliveries in by_queue.items())


def _by_queue(claims: Iterable[Claim]) -> dict[ReliableQueue, list[Delivery]]:
    by_queue: dict[ReliableQueue, list[Delivery]] = defaultdict(list)
    for rq, d in claims:
        by_queue[rq].append(d)
    return by_queue


def settle(
    rq: ReliableQueue,
    op: str,
    deliveries: list[Delivery],
    reason: str = "",
    *,
    delays_ms: list[int] | None = None,
) -> None:
    """Settle claims through the core, never leaving one kept alive with nobody to settle it:
    what cannot reach Redis is retried by the lease keeper, what Redis refused is abandoned
    to its lease (see :func:`_not_landed`). Never raises for Redis' sake.

    Args:
        rq: Their queue.
        op: ``"ack"``, ``"nack"`` (requeue, a counted run), ``"dead"`` (dead-letter) or
            ``"defer"`` (to the delayed set for ``delays_ms``, uncounted).
        deliveries: The claims.
        reason: The nack's or dead letter's reason.
        delays_ms: For ``"defer"``: one wait per claim (ms).
    """
    if not deliveries:
        return
    if op in ("nack", "dead") and len(deliveries) > 1:
        for d in deliveries:  # one script each: one that fails does not retry the others
            settle(rq, op, [d], reason)
        return
    if op not in ("ack", "nack", "dead", "defer") or (op == "defer") != (delays_ms is not None):
        raise ValueError(f"cannot settle with {op!r} (delays_ms {delays_ms!r})")
    try:
        if op == "ack":
            done = rq.ack_many(deliveries)
        elif op == "nack":
            done = [rq.nack(deliveries[0], delay_ms=0, reason=reason) != "stale"]
        elif op == "dead":
            done = [rq.dead_letter(deliveries[0], reason)]
        else:
            deferred = rq.defer(list(zip(deliveries, delays_ms or (), strict=True)))
            # The core answers a count: which claim was refused does not matter here.
            done = [i < deferred for i in range(len(deliveries))]
    except Exception as exc:
        _not_landed(rq, op, deliveries, exc, reason, delays_ms)
        return
    _log_refused(op, deliveries, done)


def _not_landed(
    rq: ReliableQueue,
    op: str,
    deliveries: list[Delivery],
    exc: Exception,
    reason: str = "",
    delays_ms: list[int] | None = None,
) -> None:
    """A settlement raised ``exc``: retry it from the lease keeper when Redis could not be
    reached; nothing to do when it ran on the primary unconfirmed (``DurabilityError``);
    otherwise Redis refused it and changed nothing: stop extending the claims, and the sweep
    brings them back after their lease (at least once, never lost)."""
    if isinstance(exc, ConnectionLost):
        rq.retry_later(op, deliveries, reason, delays_ms=delays_ms)
    elif isinstance(exc, DurabilityError):
        log.warning("%s of %d claim(s) of %s: %s", op, len(deliveries), rq.name, exc)
    else:
        log.error("%s of %d claim(s) of %s failed (%r); they return after their lease", op,
                  len(deliveries), rq.name, exc, exc_info=exc)
        abandon(rq, deliveries)


def _log_refused(op: str, deliveries: list[Delivery], done: list[bool]) -> None:
    stale = [d.id for d, ok in zip(deliveries, done, strict=True) if not ok]
    if stale:
        log.warning("%s of %s refused: the lease had expired and the message was "
                    "redelivered", op, ", ".join(stale))
