"""Prometheus metrics of belayq queues (``pip install belayq[metrics]``:
``prometheus_client``).

Register the collector in your own app::

    from prometheus_client import REGISTRY
    from belayq.metrics import QueueCollector
    REGISTRY.register(QueueCollector(lambda: [queue_a, queue_b]))

or run ``belayq exporter --url redis://... --port 9808`` (every queue it finds, or those
named). A scrape costs one stats script and two small reads per queue: O(queues), never
O(messages).

Metrics (labels ``kind`` and ``queue``: a queue is named by both, so a Celery queue and a
belayq queue of the same name are two series; ``priority`` on ``belayq_ready``):

* counters (``_total``): published, claimed, acked, nacked, reclaimed, adopted,
  dead_lettered, stale_acks, lost_claims;
* gauges: ``belayq_ready``, ``belayq_in_flight``, ``belayq_delayed``, ``belayq_dead``;
  ``belayq_oldest_ready_age_seconds`` (queues whose ids carry their publish time: belayq's
  own; not the lists stock producers fill, whose entries carry no time);
  ``belayq_oldest_lease_age_seconds``: the time since the least recently renewed lease was
  renewed, against the queue's own recorded lease (about the keeper's period while every
  holder lives; near the lease when one stopped renewing). A queue whose lease nobody
  recorded (one only its framework knows) has no lease age.

One series per queue and state: a queue handed to the collector twice is counted once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .blocking import node_client
from .errors import RESPONSE_ERROR, BelayqError, ConnectionLost, Errors
from .models import text as _text

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
    "stale_acks", "lost_claims",
)  # fmt: skip


def oldest_ready_age_s(q: ReliableQueue, now_ms: int) -> float | None:
    """Age of the oldest waiting message (s), when its id tells its publish time (ids the
    core chose); None otherwise, or when nothing waits."""
    if q.config.payload_in_list:
        return None
    heads = []
    index = -1 if q.config.ready_head == "right" else 0
    for level in q.keys.levels:
        head = q.client.lindex(level, index)
        if head is not None:
            published = published_ms_of(_text(head))
            if published is not None:
                heads.append(published)
    return (now_ms - min(heads)) / 1000 if heads else None


def published_ms_of(msg_id: str) -> int | None:
    """The publish time (ms, client clock) a core-chosen id carries in its first 12 hex
    digits; None for another id."""
    if len(msg_id) != 32:
        return None
    try:
        return int(msg_id[:12], 16)
    except ValueError:
        return None


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


def _samples(q: AnyQueue) -> Iterator[tuple[str, list[str], float]]:
    """(family, labels, value) of every series of one queue."""
    from .sharded import parts_of

    labels = [q.kind, q.name]
    stats = q.stats()
    for name in COUNTERS:
        yield name, labels, float(stats.get(name, 0))
    for step, count in zip(q.config.priority_steps, q.ready_by_level(), strict=True):
        yield "ready", [*labels, str(step)], float(count)
    for name in ("in_flight", "delayed", "dead"):
        yield name, labels, float(stats[name])
    yield "paused", labels, float(stats.get("paused", 0))
    ages_of = [("oldest_ready_age_seconds", oldest_ready_age_s)]
    if q.limits_known:
        ages_of.append(("oldest_lease_age_seconds", oldest_lease_age_s))
    for name, of in ages_of:
        ages = [age for p in parts_of(q) if (age := of(p, server_ms(p))) is not None]
        if ages:  # the oldest over a sharded queue's shards
            yield name, labels, max(ages)


class QueueCollector:
    """A prometheus_client collector of the queues ``queues()`` returns at each scrape.

    ``queues()`` may give queues, or callables that open one (the exporter's way: a queue
    that cannot be opened, or read, is left out of the scrape with a warning in the log,
    and the other queues are still exported)."""

    def __init__(self, queues: Callable[[], Iterable[AnyQueue | Callable[[], AnyQueue]]]) -> None:
        self.queues = queues

    def _each(self) -> list[AnyQueue]:
        """The queues of this scrape, each (kind, name) once."""
        out: dict[tuple[str, str], AnyQueue] = {}
        for item in self.queues():
            q = _opened(item)
            if q is not None:
                out.setdefault((q.kind, q.name), q)
        return list(out.values())

    def describe(self) -> list[Any]:
        return []  # unchecked collector: the queues may change between scrapes

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        counters = {
            name: CounterMetricFamily(f"belayq_{name}", f"Messages {name.replace('_', ' ')}",
                                      labels=LABELS)
            for name in COUNTERS
        }
        ready = GaugeMetricFamily("belayq_ready", "Messages waiting, by priority level",
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
            )
        }
        for q in self._each():
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
                families[family].add_metric(labels, value)
        yield from counters.values()
        yield ready
        yield from gauges.values()
