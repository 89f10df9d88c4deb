"""What the consumers of a queue observe for its metrics: how long messages waited
(publish -> first claim), how long claims were held (claim -> ack), the runs the framework
reported failed, and the consumers that hold leases.

The scripts do not measure these: the server would pay for them on every message. A queue
object adds its observations up in memory and writes them to the queue's ``observed`` hash
(``QueueKeys.observed``, beside the scripts' counters) in one pipeline of ``HINCRBY``: at
most once per :data:`FLUSH_EVERY_S` on an ack, on every lease keeper beat, and at
``close()``; an ack queued on a caller's transaction (a forked RQ work horse, which acks
once and exits) carries them with it. A process killed in between loses at most that
second's observations, never a message. The exporter reads the hash with one ``HGETALL``
and adds the buckets up: O(buckets) per queue.

Fields (``<h>`` is ``wait`` or ``run``): ``<h>_le_<bound>`` (observations in that bucket
only, not cumulative; ``<h>_le_inf`` above the last bound), ``<h>_sum_us`` (the sum, µs),
and the counters ``failed`` and ``published`` (the latter for queues whose producers never
go through belayq, counted at a message's first claim).

The consumers that hold leases are the queue's consumer records (``QueueKeys.consumers``,
:mod:`belayq.holders`), which also tell who holds each lease: a process registers at its
first claim, again at each lease keeper beat while it holds leases (scored by the server's
clock, so the exporter counts those registered within a lease), and its record is taken out
at the first beat at which none of its queue objects holds any.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from .config import QueueConfig
from .errors import CLIENT_ERROR
from .holders import consumer_member, unregistered
from .keys import QueueKeys
from .models import Delivery

log = logging.getLogger("belayq")

#: The property belayq:// stamps on the kombu messages it publishes: the publish time (ms
#: since the epoch, the publisher's clock). Stock producers' messages carry none.
PUBLISHED_PROPERTY = "x-belayq-published-ms"

#: Upper bounds of the histograms' buckets (s): Prometheus client's defaults, stretched to an
#: hour, as jobs and queue waits run longer than web requests.
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
             300.0, 900.0, 3600.0)

#: The histograms: queue wait (publish -> first claim) and run (claim -> ack).
HISTOGRAMS = ("wait", "run")

#: The counters observations may add to.
COUNTED = ("failed", "published")

#: Observations are written at most this often by acks (s); the keeper's beat writes them too.
FLUSH_EVERY_S = 1.0


def published_ms_of(msg_id: str) -> int | None:
    """The publish time (ms, client clock) a core-chosen id carries in its first 12 hex
    digits; None for another id."""
    if len(msg_id) != 32:
        return None
    try:
        return int(msg_id[:12], 16)
    except ValueError:
        return None


#: This process's queue objects that held leases at their last beat, by consumers key: the
#: process's record stays while any of them holds some.
_HOLDING: dict[str, set[int]] = {}
_HOLDING_LOCK = threading.Lock()


def _forget_holding_after_fork() -> None:
    global _HOLDING_LOCK
    _HOLDING.clear()
    _HOLDING_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_holding_after_fork)


def bucket_field(histogram: str, bound: float | None) -> str:
    """The stats field of one bucket (``bound`` None: above the last bound)."""
    return f"{histogram}_le_{'inf' if bound is None else format(bound, 'g')}"


def read_observed(client: Any, keys: QueueKeys) -> dict[str, int]:
    """The queue's observed hash, fields as text."""
    return {f.decode() if isinstance(f, bytes) else str(f): int(v)
            for f, v in client.hgetall(keys.observed).items()}


def read_histogram(
    observed: dict[str, int], histogram: str
) -> tuple[list[tuple[str, float]], float]:
    """Prometheus buckets (cumulative, ``le`` as text, ``+Inf`` last) and the sum (s) of one
    histogram, from the queue's observed fields."""
    total = 0.0
    buckets = []
    for bound in (*BUCKETS_S, None):
        total += float(observed.get(bucket_field(histogram, bound), 0))
        buckets.append(("+Inf" if bound is None else format(bound, "g"), total))
    return buckets, float(observed.get(f"{histogram}_sum_us", 0)) / 1e6


def _bucket(seconds: float) -> float | None:
    for bound in BUCKETS_S:
        if seconds <= bound:
            return bound
    return None


class Observations:
    """Observations not yet written, thread-safe (a keeper beat may flush while a consumer
    acks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fields: dict[str, int] = {}
        self.last_flush = 0.0  # monotonic s; 0: the first ack writes at once

    def observe(self, histogram: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        field = bucket_field(histogram, _bucket(seconds))
        with self._lock:
            f = self._fields
            f[field] = f.get(field, 0) + 1
            f[f"{histogram}_sum_us"] = f.get(f"{histogram}_sum_us", 0) + round(seconds * 1e6)

    def count(self, counter: str, n: int = 1) -> None:
        if counter not in COUNTED:
            raise ValueError(f"not a counter observations add to: {counter!r}")
        if n:
            with self._lock:
                self._fields[counter] = self._fields.get(counter, 0) + n

    def due(self) -> bool:
        return bool(self._fields) and time.monotonic() - self.last_flush >= FLUSH_EVERY_S

    def take(self) -> dict[str, int]:
        """The observations to write now (they are no longer held here)."""
        with self._lock:
            out, self._fields = self._fields, {}
            self.last_flush = time.monotonic()
        return out

    def give_back(self, fields: dict[str, int]) -> None:
        """Observations whose write failed: kept for the next one."""
        with self._lock:
            for field, n in fields.items():
                self._fields[field] = self._fields.get(field, 0) + n

    def reset(self) -> None:
        """Forget everything (a forked child: the parent's observations are the parent's)."""
        self._lock = threading.Lock()
        self._fields = {}
        self.last_flush = 0.0


def queue_writes(pipe: Any, key: str, fields: dict[str, int]) -> None:
    """Queue the writes of ``fields`` on ``pipe``."""
    for field, n in fields.items():
        pipe.hincrby(key, field, n)


class Observing:
    """The metrics' observations of a queue object, mixed into
    :class:`~belayq.ReliableQueue` (through :class:`~belayq.holding.HeldClaims`)."""

    name: str
    client: Any
    keys: QueueKeys
    config: QueueConfig
    _held: dict[str, Delivery]
    _observed: Observations
    #: Whether this queue object held leases at its last beat (see :meth:`_note_holding`).
    _holding_since_beat: bool = False

    def first_claimed(
        self, delivery: Delivery, published_ms: float | None, *, published: bool = False
    ) -> None:
        """Record, for the metrics, the first claim of a message: its queue wait (publish ->
        this claim) when its publish time is known. The core does it for the messages it
        published itself; an adapter calls it for those the framework's producers published
        (RQ's ``enqueued_at``, a kombu property). No Redis call.

        Args:
            delivery: The claim (its ``deliveries`` is 1).
            published_ms: When the message was published (ms since the epoch, the
                publisher's clock), or None when nothing tells.
            published: Count the message as published too: for a queue whose producers
                never go through belayq (RQ's push to RQ's own list), whose
                ``published`` counter would stay 0 otherwise.
        """
        if published_ms is not None and delivery.claimed_s:
            self._observed.observe("wait", delivery.claimed_s - published_ms / 1000)
        if published:
            self._observed.count("published")

    def count_failed(self, n: int = 1) -> None:
        """Record, for the metrics, runs that the framework reported failed (a Celery task
        that raised: Celery acks it all the same). No Redis call: written with the other
        observations (:meth:`flush_observations`)."""
        self._observed.count("failed", n)

    def _observe_acked(
        self, deliveries: Sequence[Delivery], done: Sequence[bool], pipeline: Any = None
    ) -> None:
        """Record the run time (claim -> ack) of the claims an ack settled; write the
        observations when they are due (queued on ``pipeline`` when given)."""
        now = time.time()
        for d, ok in zip(deliveries, done, strict=True):
            if ok and d.claimed_s:
                self._observed.observe("run", now - d.claimed_s)
        if self._observed.due():
            self.flush_observations(pipeline)

    def flush_observations(self, pipeline: Any = None) -> None:
        """Write the observations made since the last write to the queue's observed hash
        (:mod:`belayq.observing`): in one pipeline of its own, or queued on ``pipeline``
        (the caller executes it). Never raises for Redis' sake: what could not be written is
        kept for the next write."""
        if self.config.transient:  # a transient queue keeps no counters
            self._observed.take()
            return
        fields = self._observed.take()
        if not fields:
            return
        if pipeline is not None:
            queue_writes(pipeline, self.keys.observed, fields)
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                queue_writes(pipe, self.keys.observed, fields)
                pipe.execute()
        except CLIENT_ERROR as exc:
            log.debug("the metrics' observations of %s wait for the next write: %r",
                      self.name, exc)
            self._observed.give_back(fields)

    def _note_holding(self) -> None:
        """While this queue object holds leases, register the process again as a consumer
        of the queue (each beat); once no queue object of the process holds any on it, take
        its record out, and let its next claim register it again."""
        holding = bool(self._held)
        if not holding and not self._holding_since_beat:
            return
        key = self.keys.consumers
        with _HOLDING_LOCK:
            objects = _HOLDING.setdefault(key, set())
            (objects.add if holding else objects.discard)(id(self))
            others = bool(objects - {id(self)})
            if not objects:
                del _HOLDING[key]
        self._holding_since_beat = holding
        if holding:
            self._register()  # type: ignore[attr-defined]  # the queue's (consuming.py)
            return
        if others:
            return
        try:
            self.client.zrem(key, consumer_member())
        except CLIENT_ERROR as exc:
            log.debug("consumer record of %s not taken out: %r", self.name, exc)
        unregistered(self.client, key)  # the next claim registers again

