"""A producer and consumer threads on one queue of a Redis Cluster, each with a client of
its own, recording what happened to every message, for the failover tests.

The producer publishes ``m0, m1, ...`` one after another; a payload whose publish returned
is *confirmed* (with ``wait_replicas=1``: a replica had it), one whose publish raised is
*unconfirmed* (``DurabilityError``: it is on the primary, no replica confirmed it), one
whose publish failed otherwise *uncertain*. Each
consumer claims one message at a time (half with ``ReliableQueue.claim``, half with
``claim_any``, so both blocked-BLMOVE paths are exercised), records the run and acks it.
Errors are counted by kind, never fatal: a consumer that keeps going through a failover
without a restart is what the tests check.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from belayq import ReliableQueue
from belayq.claim_any import claim_any
from belayq.embedded import RedisClusterServers
from belayq.errors import BelayqError, DurabilityError

from .conftest import cluster_client


@dataclass
class Run:
    """One delivery run by a consumer."""

    payload: str
    consumer: int
    claimed_at: float  # monotonic s, when the claim returned it
    acked_at: float  # monotonic s, after the ack call returned or raised
    outcome: str  # "acked", "stale" (ack refused: redelivered meanwhile), "unconfirmed"


@dataclass
class Load:
    cluster: RedisClusterServers
    name: str
    options: dict[str, Any]
    consumers: int = 4
    publish_pause_s: float = 0.005
    work_s: float = 0.05  # each run holds its claim this long: some are in flight at the event
    confirmed: list[str] = field(default_factory=list)
    unconfirmed: list[tuple[str, float, float]] = field(default_factory=list)  # (p, t, took)
    uncertain: list[str] = field(default_factory=list)  # publish failed otherwise
    runs: list[Run] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    messages: dict[str, str] = field(default_factory=dict)  # the last error of each kind
    stop_publishing: threading.Event = field(default_factory=threading.Event)
    stop_consuming: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    clients: list[Any] = field(default_factory=list)
    crashed: list[BaseException] = field(default_factory=list)

    def queue(self) -> ReliableQueue:
        client = cluster_client(self.cluster)
        self.clients.append(client)
        return ReliableQueue(client, self.name, **self.options)

    def start(self) -> Load:
        targets = [(self._produce, ())] + [(self._consume, (i,)) for i in range(self.consumers)]
        for target, args in targets:
            t = threading.Thread(target=self._guard, args=(target, *args), daemon=True)
            self.threads.append(t)
            t.start()
        return self

    def _guard(self, target: Any, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # recorded: the test fails on any consumer crash
            self.crashed.append(exc)
            raise

    def _produce(self) -> None:
        q = self.queue()
        i = 0
        while not self.stop_publishing.is_set():
            payload = f"m{i}"
            i += 1
            t0 = time.monotonic()
            try:
                q.publish(payload)
                self.confirmed.append(payload)
            except DurabilityError as exc:
                self.errors["publish DurabilityError"] += 1
                self.messages["publish DurabilityError"] = str(exc)
                self.unconfirmed.append((payload, t0, time.monotonic() - t0))
            except BelayqError as exc:  # ConnectionLost: it may or may not have landed
                self.errors[f"publish {type(exc).__name__}"] += 1
                self.uncertain.append(payload)
            time.sleep(self.publish_pause_s)

    def _consume(self, index: int) -> None:
        q = self.queue()
        while not self.stop_consuming.is_set():
            try:
                got = claim_any([q], timeout=0.5) if index % 2 else q.claim(timeout=0.5)
            except BelayqError as exc:
                self.errors[f"claim {type(exc).__name__}"] += 1
                time.sleep(0.05)
                continue
            claimed_at = time.monotonic()
            for d in got:
                payload = d.payload.decode()
                time.sleep(self.work_s)
                try:
                    outcome = "acked" if q.ack(d) else "stale"
                except DurabilityError:
                    outcome = "unconfirmed"  # the ack ran on the primary; no replica has it
                    self.errors["ack DurabilityError"] += 1
                except BelayqError as exc:
                    self.errors[f"ack {type(exc).__name__}"] += 1
                    q.retry_later("ack", [d])
                    outcome = "retrying"
                self.runs.append(Run(payload, index, claimed_at, time.monotonic(), outcome))

    def close(self) -> None:
        self.stop_publishing.set()
        self.stop_consuming.set()
        for t in self.threads:
            t.join(10)
        for c in self.clients:
            c.close()

    # -- what happened -----------------------------------------------------------------

    def written(self) -> set[str]:
        """The payloads that are in Redis for sure: confirmed or unconfirmed."""
        return set(self.confirmed) | {p for p, _, _ in self.unconfirmed}

    def consumed(self) -> Counter[str]:
        return Counter(r.payload for r in self.runs)

    def first_run_after(self, t: float) -> Run | None:
        return next((r for r in list(self.runs) if r.acked_at > t), None)

    def consumers_after(self, t: float) -> set[int]:
        return {r.consumer for r in list(self.runs) if r.acked_at > t}

    def in_flight_at(self, t: float) -> set[str]:
        """Payloads some consumer had claimed by ``t`` and not yet acked."""
        return {r.payload for r in list(self.runs) if r.claimed_at <= t < r.acked_at}

    def alive(self) -> bool:
        return all(t.is_alive() for t in self.threads[1:])
