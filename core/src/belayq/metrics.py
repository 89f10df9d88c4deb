"""Prometheus metrics of belayq queues (``pip install belayq[metrics]``:
``prometheus_client``).

Register the collector in your own app::

    from prometheus_client import REGISTRY
    from belayq.metrics import QueueCollector
    REGISTRY.register(QueueCollector(lambda: [queue_a, queue_b]))

or run ``belayq exporter --url redis://... --port 9808`` (every queue it finds, or those
named). A scrape costs one stats script and a few small reads per queue: O(queues), never
O(messages).

Metrics (labels ``kind`` and ``queue``: a queue is named by both, so a Celery queue and a
belayq queue of the same name are two series; ``priority`` on ``belayq_ready``). The sizes,
ages and the framework's numbers are those ``belayq queues`` and the dashboard show, read by
one function (:mod:`belayq.readmodel`):

* counters (``_total``): published, claimed, acked, nacked, reclaimed, adopted,
  dead_lettered, stale_acks, lost_claims, failed (runs the framework reported failed),
  untraced (messages published while traced whose context could not be kept with them),
  and out (messages that left the queue finished: acked or dead-lettered, each once);
* gauges: ``belayq_ready`` (by priority level: the levels that hold messages, and the
  first, so a queue whose messages carry no priority has one series), ``belayq_in_flight``,
  ``belayq_delayed`` (belayq's delayed set and what the framework holds back itself: RQ's
  scheduled jobs), ``belayq_dead``; ``belayq_oldest_ready_age_seconds`` (when the oldest
  entry tells its publish time: belayq's ids, kombu envelopes belayq:// stamped, an RQ
  job's ``enqueued_at``, a Dramatiq message's timestamp); ``belayq_running_for_seconds``
  (how long the longest-running claim has run, since its claim); ``belayq_consumers``
  (consumers holding leases); ``belayq_framework_failed`` (the failed jobs the framework
  keeps: RQ's FailedJobRegistry, the failed runs recorded for Celery and Dramatiq);
  ``belayq_oldest_lease_age_seconds``: the time since the least recently renewed lease was
  renewed, against the queue's own recorded lease (about the keeper's period while every
  holder lives; near the lease when one stopped renewing). A queue whose lease nobody
  recorded (one only its framework knows) has no lease age.
* ``belayq_eviction_possible{policy, evicts}``: the server's, not a queue's: 1 when its
  ``maxmemory-policy`` may delete queue data (:mod:`belayq.eviction`), else 0.
* histograms: ``belayq_queue_wait_seconds`` (publish -> first claim) and
  ``belayq_run_seconds`` (claim -> ack), observed by the consumers
  (:mod:`belayq.observing`).

One series per queue and state: a queue handed to the collector twice is counted once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import eviction, readmodel
from .blocking import node_client
from .errors import RESPONSE_ERROR, BelayqError, ConnectionLost, Errors
from .observing import read_histogram, read_observed
from .readmodel import published_ms_of_entry

#: The errors of a queue that cannot be read: it is left out of the scrape, and logged.
_SHOWN: Errors = (BelayqError, *RESPONSE_ERROR)

if TYPE_CHECKING:
    from .queue import ReliableQueue
    from .sharded import AnyQueue

log = logging.getLogger("belayq")

#: The labels of every series: a queue is named by its kind and its name.
LABELS = ["kind", "queue"]

#: The counters, as the queue's stats hash names them.
COUNTERS = (
    "published", "claimed", "acked", "nacked", "reclaimed", "adopted", "dead_lettered",
    "stale_acks", "lost_claims", "failed", "untraced",
)  # fmt: skip

#: The histograms: (family, stats name, help).
HISTOGRAM_FAMILIES = (
    ("queue_wait_seconds", "wait", "Time from publish to first claim"),
    ("run_seconds", "run", "Time from claim to ack"),
)


def oldest_ready_age_s(q: ReliableQueue, now_ms: int) -> float | None:
    """Age of the oldest waiting message (s), when something tells its publish time (see
    :func:`_published_ms`); None otherwise, or when nothing waits."""
    heads = []
    index = -1 if q.config.ready_head == "right" else 0
    for level in q.keys.levels:
        head = q.client.lindex(level, index)
        if head is not None:
            published = published_ms_of_entry(q, bytes(head))
            if published is not None:
                heads.append(published)
    return max(0.0, (now_ms - min(heads)) / 1000) if heads else None


def consumers(q: ReliableQueue, now_ms: int) -> int:
    """The consumers holding leases: those registered within a lease (at a claim, or at a
    lease keeper beat while they hold leases: see :mod:`belayq.observing`); O(log n)."""
    return int(q.client.zcount(q.keys.consumers, now_ms - q.config.lease_ms, "+inf"))


def oldest_lease_age_s(q: ReliableQueue, now_ms: int) -> float | None:
    """Seconds since the least recently renewed lease was renewed; None when none is held."""
    first = q.client.zrange(q.keys.leases, 0, 0, withscores=True)
    if not first:
        return None
    deadline = float(first[0][1])
    return max(0.0, (now_ms - (deadline - q.config.lease_ms)) / 1000)


def server_ms(q: ReliableQueue) -> int:
    """The clock of the server that holds the queue (ms)."""
    seconds, micros = node_client(q).time()
    return int(seconds) * 1000 + int(micros) // 1000


def _opened(item: AnyQueue | Callable[[], AnyQueue]) -> AnyQueue | None:
    if not callable(item):
        return item
    try:
        return item()
    except ConnectionLost:
        raise
    except _SHOWN as exc:
        log.warning("metrics: a queue left out of this scrape: %s", exc)
        return None


def ready_by_priority(q: AnyQueue) -> list[tuple[int, int]]:
    """(priority step, messages waiting) of the levels that hold messages, and of the first
    level always (an empty queue reads 0): a queue whose messages carry no priority exports
    one series, not one per level it could use."""
    steps = q.config.priority_steps
    counts = q.ready_by_level()
    return [(step, n) for i, (step, n) in enumerate(zip(steps, counts, strict=True))
            if n or i == 0]


def queue_label(q: AnyQueue) -> str:
    """The ``queue`` label of a queue: its name, or, for a queue of a framework's
    non-default namespace (Dramatiq's ``namespace``, Celery's ``global_keyprefix``: two apps
    on one server), the name its framework gives its list (``app2:default``,
    ``{app1}:celery``), so the two apps' queues of one name are two series."""
    namespace = getattr(q, "namespace", "")  # a namespace is a plain queue's only
    return str(q.keys.ready) if namespace and hasattr(q, "keys") else q.name


def _samples(q: AnyQueue) -> Iterator[tuple[str, list[str], Any]]:
    """(family, labels, value) of every series of one queue; the sizes, ages and the
    framework's numbers are those every tool shows (:mod:`belayq.readmodel`)."""
    from .sharded import parts_of

    labels = [q.kind, queue_label(q)]
    stats, counts = readmodel.read_stats(q)
    observed: Counter[str] = Counter()
    for p in parts_of(q):
        observed.update(read_observed(p.client, p.keys))
    for name in COUNTERS:  # published: also what consumers counted (RQ's producers' jobs)
        yield name, labels, float(stats.get(name, 0) + observed.get(name, 0))
    yield "out", labels, float(counts["out"])
    for step, count in ready_by_priority(q):
        yield "ready", [*labels, str(step)], float(count)
    for name in ("in_flight", "delayed", "dead"):
        yield name, labels, float(counts[name])
    yield "paused", labels, float(counts["paused"])
    if counts["oldest_ready_s"] is not None:
        yield "oldest_ready_age_seconds", labels, float(counts["oldest_ready_s"])
    if counts["running_for_s"] is not None:
        yield "running_for_seconds", labels, float(counts["running_for_s"])
    parts = [(p, server_ms(p)) for p in parts_of(q)]
    if q.limits_known:
        ages = [age for p, now in parts if (age := oldest_lease_age_s(p, now)) is not None]
        if ages:  # the oldest over a sharded queue's shards
            yield "oldest_lease_age_seconds", labels, max(ages)
    yield "consumers", labels, float(sum(consumers(p, now) for p, now in parts))
    if counts["failed"] is not None:
        yield "framework_failed", labels, float(counts["failed"])
    for family, histogram, _ in HISTOGRAM_FAMILIES:
        yield family, labels, read_histogram(observed, histogram)


def _eviction_gauge(family: Any, clients: list[Any]) -> Any:
    """``belayq_eviction_possible``, by policy, of each server (read at this scrape)."""
    gauge = family("belayq_eviction_possible", "1 when the server's maxmemory-policy may "
                   "delete queue data (allkeys-*: any key; volatile-*: keys with a TTL), "
                   "else 0", labels=["policy", "evicts"])
    seen: dict[int, Any] = {id(c): c for c in clients}
    for client in seen.values():
        told = eviction.policies(client)
        found = eviction.judge(told)
        if not told:  # the server will not say: no sample rather than a guess
            continue
        if found is None:
            gauge.add_metric(["noeviction", "nothing"], 0.0)
        else:
            gauge.add_metric([found.policy, "any key" if found.any_key else "keys with a TTL"],
                             1.0)
    return gauge


class QueueCollector:
    """A prometheus_client collector of the queues ``queues()`` returns at each scrape.

    ``queues()`` may give queues, or callables that open one (the exporter's way: a queue
    that cannot be opened, or read, is left out of the scrape with a warning in the log,
    and the other queues are still exported)."""

    def __init__(self, queues: Callable[[], Iterable[AnyQueue | Callable[[], AnyQueue]]], *,
                 client: Any = None) -> None:
        self.queues = queues
        #: The server whose eviction policy is exported (default: the queues' servers).
        self.client = client

    def _each(self) -> list[AnyQueue]:
        """The queues of this scrape, each (kind, name) once."""
        out: dict[tuple[str, str], AnyQueue] = {}
        for item in self.queues():
            q = _opened(item)
            if q is not None:
                out.setdefault((q.kind, queue_label(q)), q)
        return list(out.values())

    def describe(self) -> list[Any]:
        return []  # unchecked collector: the queues may change between scrapes

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        counters = {
            name: CounterMetricFamily(f"belayq_{name}", f"Messages {name.replace('_', ' ')}",
                                      labels=LABELS)
            for name in COUNTERS
        }
        counters["out"] = CounterMetricFamily(
            "belayq_out", "Messages that left the queue finished (acked or dead-lettered)",
            labels=LABELS)
        ready = GaugeMetricFamily("belayq_ready", "Messages waiting, by priority level "
                                  "(the levels that hold messages, and the first)",
                                  labels=[*LABELS, "priority"])
        gauges = {
            name: GaugeMetricFamily(f"belayq_{name}", help_text, labels=LABELS)
            for name, help_text in (
                ("in_flight", "Messages claimed and not settled (leases held)"),
                ("delayed", "Messages waiting for their due time"),
                ("dead", "Messages in the dead-letter set"),
                ("paused", "1 while the queue's claims are paused, else 0"),
                ("oldest_ready_age_seconds", "Age of the oldest waiting message"),
                ("oldest_lease_age_seconds",
                 "Time since the least recently renewed lease was renewed"),
                ("consumers", "Consumers holding leases"),
                ("running_for_seconds",
                 "How long the longest-running claim has run (since its claim)"),
                ("framework_failed",
                 "Failed jobs the framework keeps: RQ's FailedJobRegistry, the failed runs "
                 "recorded for Celery and Dramatiq"),
            )
        }
        histograms = {
            name: HistogramMetricFamily(f"belayq_{name}", help_text, labels=LABELS)
            for name, _, help_text in HISTOGRAM_FAMILIES
        }
        from .sharded import parts_of

        queues = self._each()
        yield _eviction_gauge(GaugeMetricFamily, [self.client] if self.client is not None
                              else [parts_of(q)[0].client for q in queues])
        for q in queues:
            try:
                samples = list(_samples(q))
            except ConnectionLost:
                raise
            except _SHOWN as exc:
                log.warning("metrics: queue %r (%s) left out of this scrape: %s", q.name,
                            q.kind, exc)
                continue
            families: dict[str, Any] = {"ready": ready, **counters, **gauges}
            for family, labels, value in samples:
                if family in histograms:
                    buckets, total = value
                    histograms[family].add_metric(labels, buckets, total)
                else:
                    families[family].add_metric(labels, value)
        yield from counters.values()
        yield ready
        yield from gauges.values()
        yield from histograms.values()
