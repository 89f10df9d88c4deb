"""Which core claim each kombu delivery tag stands for, and settling them through the core.

A kombu delivery tag is minted per claim (``<token>.<queue>``), so two copies of one message
can never settle each other's lease. The table is shared by the channels of a transport:
kombu routes a delivery to whichever channel registered the queue's callback.

Settling never loses a message:

* an ack or nack that cannot reach Redis is retried later (the lease keeper keeps the claim
  alive meanwhile), instead of being dropped as kombu would;
* claims a closed channel could not hand back are abandoned: the keeper stops extending them
  and the sweep returns them after the lease;
* when a channel closes under running Celery tasks (a connection blip), their claims are kept
  and extended until the task settles them, so a blip never runs a task twice.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from belayq import Delivery, ReliableQueue
from belayq.errors import ConnectionLost

log = logging.getLogger("belayq.kombu")

Claim = tuple[ReliableQueue, Delivery]


def tag_of(queue: str, delivery: Delivery) -> str:
    """The kombu delivery tag of one claim: unique per claim in the process."""
    return f"{delivery.token}.{queue}"


def running_tags() -> set[Any]:
    """Delivery tags of the tasks a Celery worker in this process is running right now.

    Empty outside a Celery worker. Celery keeps a task's request in
    ``celery.worker.state.active_requests`` from the moment a pool accepted it until it
    is done; the request holds the kombu message.
    """
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return set()
    tags = set()
    for request in list(getattr(state, "active_requests", ())):
        message = getattr(request, "_message", None)
        tag = getattr(message, "delivery_tag", None)
        if tag is not None:
            tags.add(tag)
    return tags


def abandon(rq: ReliableQueue, deliveries: Iterable[Delivery]) -> None:
    """Stop extending these claims; the sweep returns them once their lease runs out."""
    forget = getattr(rq, "abandon", None) or rq._forget  # see the report: core API wanted
    forget(list(deliveries))


class Claims:
    """Delivery tag -> claim, for one transport; thread-safe (acks come from any thread)."""

    def __init__(self) -> None:
        self._claims: dict[Any, Claim] = {}
        self._lock = threading.Lock()

    def add(self, tag: Any, rq: ReliableQueue, delivery: Delivery) -> None:
        with self._lock:
            self._claims[tag] = (rq, delivery)

    def get(self, tag: Any) -> Claim | None:
        with self._lock:
            return self._claims.get(tag)

    def pop(self, tag: Any) -> Claim | None:
        with self._lock:
            return self._claims.pop(tag, None)

    def __len__(self) -> int:
        return len(self._claims)

    def abandon(self, tag: Any) -> None:
        """Stop extending a claim without settling it; it comes back after its lease."""
        claim = self.pop(tag)
        if claim is not None:
            abandon(claim[0], [claim[1]])

    def ack(self, tag: Any) -> None:
        """Settle for good. A stale token (lease lost, redelivered elsewhere) is logged."""
        claim = self.pop(tag)
        if claim is None:
            return
        rq, d = claim
        try:
            if not rq.ack(d):
                log.warning(
                    "ack of %s refused: its lease had expired and the message was redelivered",
                    tag,
                )
        except ConnectionLost:
            RETRY.add("ack", rq, d, "")

    def reject(self, tag: Any, *, requeue: bool, dead_letter: bool) -> None:
        """Requeue (counted delivery), dead-letter, or drop a claim."""
        claim = self.pop(tag)
        if claim is None:
            return
        rq, d = claim
        if requeue:
            op, reason = "nack", "rejected with requeue"
        elif dead_letter:
            op, reason = "dead", "rejected without requeue"
        else:
            op, reason = "ack", ""
        try:
            _settle(op, rq, d, reason)
        except ConnectionLost:
            RETRY.add(op, rq, d, reason)

    def release(self, tags: Iterable[Any]) -> int:
        """Hand claims back to the front of their queues (uncounted); returns how many.

        Claims that cannot be handed back (Redis unreachable) are abandoned to the sweep.
        """
        by_queue: dict[ReliableQueue, list[Delivery]] = defaultdict(list)
        for tag in tags:
            claim = self.pop(tag)
            if claim is not None:
                by_queue[claim[0]].append(claim[1])
        released = 0
        for rq, deliveries in by_queue.items():
            try:
                released += rq.release(deliveries)
            except Exception:  # the sweep brings them back; nothing is lost
                log.warning(
                    "could not release %d message(s) of %s; they return after their lease",
                    len(deliveries),
                    rq.name,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                abandon(rq, deliveries)
        return released


def _settle(op: str, rq: ReliableQueue, d: Delivery, reason: str) -> None:
    if op == "ack":
        ok = rq.ack(d)
    elif op == "nack":
        ok = rq.nack(d, delay_ms=0, reason=reason) != "stale"
    else:
        ok = rq.dead_letter(d, reason)
    if not ok:
        log.warning("%s of %s refused: its lease had expired and it was redelivered", op, d.id)


class _Retry:
    """Settlements that could not reach Redis, retried from the pollers' sweep timer."""

    def __init__(self) -> None:
        self._pending: list[tuple[str, ReliableQueue, Delivery, str]] = []
        self._lock = threading.Lock()

    def add(self, op: str, rq: ReliableQueue, d: Delivery, reason: str) -> None:
        log.warning("could not %s %s (Redis unreachable); will retry", op, d.id)
        with self._lock:
            self._pending.append((op, rq, d, reason))

    def __len__(self) -> int:
        return len(self._pending)

    def run(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for i, (op, rq, d, reason) in enumerate(pending):
            try:
                _settle(op, rq, d, reason)
            except ConnectionLost:
                with self._lock:
                    self._pending.extend(pending[i:])
                return


class _Kept:
    """Claims a closed channel kept because Celery was running their tasks.

    They stay leased (extended by the keeper) until the task settles them. A claim whose
    task is no longer running at two checks in a row (Celery cancelled it, or dropped it
    without settling) is released, so it cannot stay leased for the life of the worker.
    """

    def __init__(self) -> None:
        self._kept: dict[Any, Claims] = {}
        self._suspects: set[Any] = set()
        self._lock = threading.Lock()

    def keep(self, tags: Iterable[Any], claims: Claims) -> None:
        with self._lock:
            for tag in tags:
                self._kept[tag] = claims

    def __len__(self) -> int:
        return len(self._kept)

    def check(self) -> None:
        if not self._kept:
            return
        running = running_tags()
        with self._lock:
            for tag, claims in list(self._kept.items()):
                if claims.get(tag) is None:
                    del self._kept[tag]
                    self._suspects.discard(tag)
                elif tag in running:
                    self._suspects.discard(tag)
                elif tag in self._suspects:
                    del self._kept[tag]
                    self._suspects.discard(tag)
                    claims.release([tag])
                else:
                    self._suspects.add(tag)


RETRY = _Retry()
KEPT = _Kept()
