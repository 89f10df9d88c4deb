"""The demo's worker pool: worker threads that claim, "work" for a
set latency, then ack, fail (nack; dead after ``max_deliveries``) or hang.

A hang is a simulated crash: the worker's queue object stops keeping its leases and the
claim is never settled (``close(release=False)``), and a fresh worker takes the thread's
place, as a supervisor would restart a process. The hung claim's lease runs out and the
sweep (any live worker's keeper, or the page's button) puts the message back.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import redis

from ..errors import CLIENT_ERROR, ConfigError
from ..queue import ReliableQueue

#: The job kinds the demo page enqueues.
KINDS = ("email", "webhook", "thumbnail", "invoice")
#: The most workers, and jobs per enqueue, the page may ask for.
MAX_WORKERS = 64
MAX_BATCH = 10_000
#: How long a worker's claim blocks before it looks at its stop flag again (s).
CLAIM_WAIT_S = 0.5
#: Hung claims remembered for the page (the newest).
HUNG_SHOWN = 200


@dataclass(frozen=True)
class PoolSettings:
    """The pool's knobs: workers, work latency (ms), and failure and hang rates (0..1)."""

    size: int = 4
    latency_ms: int = 300
    fail_rate: float = 0.0
    hang_rate: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.size <= MAX_WORKERS:
            raise ConfigError(f"size must be 0..{MAX_WORKERS}, got {self.size}")
        if not 0 <= self.latency_ms <= 600_000:
            raise ConfigError(f"latency_ms must be 0..600000, got {self.latency_ms}")
        for name in ("fail_rate", "hang_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be 0..1, got {getattr(self, name)}")
        if self.fail_rate + self.hang_rate > 1.0:
            raise ConfigError("fail_rate + hang_rate must be at most 1")


class DemoPool:
    """Worker threads on queue ``name`` (opened with ``options``), reconfigured live."""

    def __init__(self, client: redis.Redis, name: str, options: dict[str, Any]) -> None:
        self.client = client
        self.name = name
        self.options = options
        self.settings = PoolSettings(size=0)
        self.counts: Counter[str] = Counter()
        self.hung: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.producer = ReliableQueue(client, name, keeper=False, **options)

    def enqueue(self, kind: str, count: int) -> int:
        """Publish ``count`` jobs of ``kind``; returns how many."""
        if kind not in KINDS:
            raise ConfigError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not 1 <= count <= MAX_BATCH:
            raise ConfigError(f"count must be 1..{MAX_BATCH}, got {count}")
        with self._lock:
            first = self.counts["enqueued"]
            self.counts["enqueued"] += count
        payloads = [json.dumps({"kind": kind, "n": first + i, "at_ms": int(time.time() * 1000)})
                    for i in range(count)]
        self.producer.publish_many(payloads)
        return count

    def configure(self, settings: PoolSettings) -> None:
        """Replace the running workers by ``settings.size`` workers with these knobs (the
        old ones hand their unsettled claims back as they stop)."""
        self.stop()
        with self._lock:
            self.settings = settings
            self._stop = threading.Event()
            self._threads = [
                threading.Thread(target=self._work, args=(n, settings, self._stop),
                                 name=f"belayq-demo-worker-{n}", daemon=True)
                for n in range(settings.size)
            ]  # fmt: skip
            for t in self._threads:
                t.start()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            threads, self._threads = self._threads, []
            wait = CLAIM_WAIT_S * 4 + self.settings.latency_ms / 1000
            self.settings = PoolSettings(**{**asdict(self.settings), "size": 0})
        for t in threads:
            t.join(timeout=wait)

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"settings": asdict(self.settings), "counts": dict(self.counts),
                    "alive": sum(t.is_alive() for t in self._threads),
                    "hung_ids": list(self.hung)}

    def _work(self, n: int, s: PoolSettings, stop: threading.Event) -> None:
        q = ReliableQueue(self.client, self.name, **self.options)
        try:
            while not stop.is_set():
                for d in q.claim(timeout=CLAIM_WAIT_S):
                    if stop.wait(s.latency_ms / 1000):
                        break  # close() below hands the claim back
                    q = self._finish(q, d, n, s)
        except CLIENT_ERROR:
            self._count("errors")
        finally:
            q.close()

    def _finish(self, q: ReliableQueue, d: Any, n: int, s: PoolSettings) -> ReliableQueue:
        roll = random.random()
        kind = json.loads(d.payload).get("kind", "?") if d.payload.startswith(b"{") else "?"
        if roll < s.hang_rate:
            q.close(release=False)  # the crash: no more extensions, no settle
            with self._lock:
                self.hung[d.id] = time.time()
                while len(self.hung) > HUNG_SHOWN:
                    del self.hung[next(iter(self.hung))]
            self._count("hung")
            return ReliableQueue(self.client, self.name, **self.options)  # the restart
        if roll < s.hang_rate + s.fail_rate:
            q.nack(d, reason=f"{kind}: simulated failure in worker {n}")
            self._count("failed_runs")
        else:
            q.ack(d, result=json.dumps({"kind": kind, "worker": n, "ms": s.latency_ms}))
            self._count("completed")
        return q

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1
