"""A producer, consumers and a replication watcher that run through a Sentinel failover,
and the record of what each of them saw (used by ``test_core_failover.py``).

Every thread has its own Sentinel-managed client (as separate processes would) and keeps a
log with monotonic times: the producer each publish that returned, the consumers each
delivery and each ack outcome, the watcher the latest moment up to which every write of
the primary was on both replicas (``replicated_through``). The checks compare these logs
with what the promoted replica still holds after the failover.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.sentinel import Sentinel

from belayq import ConnectionLost, Delivery, DurabilityError, ReliableQueue
from belayq.claim_any import claim_any
from belayq.embedded import RedisSentinelServers

#: Lease of every claim: claims the promoted replica never saw expire after it.
LEASE_MS = 3_000
#: Errors a call may raise while the primary is away; the caller tries again.
AWAY = (ConnectionLost, DurabilityError)


def master_client(group: RedisSentinelServers, **kwargs: Any) -> redis.Redis:
    """A new Sentinel-managed client of the group's primary (its own connection pool)."""
    sentinel = Sentinel(group.sentinel_addresses, socket_timeout=1.0)
    kwargs.setdefault("socket_timeout", 2.0)
    return sentinel.master_for(group.service_name, **kwargs)


@dataclass
class Delivered:
    payload: str
    token: str
    at: float  # monotonic s, when the claim returned
    acked_at: float | None = None  # when an ack of it returned True
    refused: bool = False  # its ack returned False (the lease was lost)


@dataclass
class Run:
    """What the threads saw. Times are ``time.monotonic()``."""

    published: dict[str, float] = field(default_factory=dict)  # payload -> publish returned
    unsure: set[str] = field(default_factory=set)  # publishes that raised at least once
    deliveries: dict[str, list[Delivered]] = field(default_factory=lambda: defaultdict(list))
    replicated_through: float = 0.0
    killed_at: float | None = None
    first_claim_after: float | None = None  # first claim that returned a message after the kill
    first_ack_after: float | None = None
    first_publish_after: float | None = None
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note_error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.errors[f"{where}: {type(exc).__name__}"] += 1

    def after_kill(self, at: float) -> bool:
        return self.killed_at is not None and at > self.killed_at


class Traffic:
    """A producer thread, ``consumers`` consumer threads and a replication watcher on a
    queue of ``group``, until :meth:`stop`. Clearing ``producing`` or ``consuming`` pauses
    those threads; while ``holding`` is set, a consumer keeps the batch it claimed (its work
    takes that long).

    The producer publishes ``m0``, ``m1``... one at a time, retrying a publish that raised
    with the same ``dedup_id``, so a publish that landed before its reply was lost is not
    stored twice. Each consumer claims up to 4, then acks them, retrying an ack that raised
    until it returns; the second consumer waits through :func:`claim_any` (its own blocking
    connection) on the queue and an empty one.
    """

    def __init__(
        self, group: RedisSentinelServers, name: str, *, consumers: int = 2, **options: Any
    ) -> None:
        self.group = group
        self.name = name
        self.options = {"lease_ms": LEASE_MS, "dedup_window_ms": 60_000, **options}
        self.run = Run()
        self.stopping = threading.Event()
        self.producing = threading.Event()
        self.producing.set()
        self.consuming = threading.Event()
        self.consuming.set()
        self.holding = threading.Event()  # while set, a claimed batch waits for its ack
        self.holders = 0  # consumers that hold a batch now
        self.clients: list[redis.Redis] = []
        self.queues: list[ReliableQueue] = []
        self.threads = [
            threading.Thread(target=self._guard, args=(self._produce,), name="producer"),
            threading.Thread(target=self._guard, args=(self._watch,), name="watcher"),
        ]
        for i in range(consumers):
            self.threads.append(
                threading.Thread(target=self._guard, args=(self._consume, i), name=f"consumer-{i}")
            )
        self.crashed: list[BaseException] = []

    def queue(self, name: str | None = None) -> ReliableQueue:
        client = master_client(self.group)
        self.clients.append(client)
        q = ReliableQueue(client, name or self.name, **self.options)
        self.queues.append(q)
        return q

    def start(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)
        for q in self.queues:
            with contextlib.suppress(Exception):
                q.close(release=False)
        for c in self.clients:
            with contextlib.suppress(Exception):
                c.close()

    def _guard(self, target: Any, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # reported by the test
            self.crashed.append(exc)
            raise

    # -- the threads -----------------------------------------------------------------

    def _produce(self) -> None:
        q = self.queue()
        run = self.run
        i = 0
        while not self.stopping.is_set():
            if not self.producing.is_set():
                self.stopping.wait(0.05)
                continue
            payload = f"m{i}"
            while not self.stopping.is_set():
                try:
                    q.publish(payload, dedup_id=payload)
                except AWAY as exc:
                    run.note_error("publish", exc)
                    run.unsure.add(payload)
                    time.sleep(0.02)
                    continue
                now = time.monotonic()
                with run.lock:
                    run.published[payload] = now
                    if run.after_kill(now) and run.first_publish_after is None:
                        run.first_publish_after = now
                break
            i += 1
            time.sleep(0.003)  # about 200 messages a second: a busy queue, not a benchmark

    def _consume(self, index: int) -> None:
        q = self.queue()
        other = self.queue(f"{self.name}-empty") if index == 1 else None
        run = self.run
        while not self.stopping.is_set():
            if not self.consuming.is_set():
                self.stopping.wait(0.01)
                continue
            try:
                got = claim_any([q, other], timeout=0.5, count=4) if other else q.claim(0.5, 4)
            except AWAY as exc:
                run.note_error("claim", exc)
                time.sleep(0.02)
                continue
            now = time.monotonic()
            records = [Delivered(d.payload.decode(), d.token, now) for d in got]
            with run.lock:
                for r in records:
                    run.deliveries[r.payload].append(r)
                if got and run.after_kill(now) and run.first_claim_after is None:
                    run.first_claim_after = now
            if got:
                self._work()
                self._ack(q, got, records)

    def _work(self) -> None:
        if not self.holding.is_set():
            time.sleep(0.002)
            return
        with self.run.lock:
            self.holders += 1
        try:
            while self.holding.is_set() and not self.stopping.is_set():
                self.stopping.wait(0.01)
        finally:
            with self.run.lock:
                self.holders -= 1

    def _ack(self, q: ReliableQueue, got: list[Delivery], records: list[Delivered]) -> None:
        run = self.run
        while True:
            try:
                outcome = q.ack_many(got)
            except AWAY as exc:
                run.note_error("ack", exc)
                time.sleep(0.02)
                continue
            now = time.monotonic()
            with run.lock:
                for r, ok in zip(records, outcome, strict=True):
                    if ok:
                        r.acked_at = now
                    else:
                        r.refused = True
                if any(outcome) and run.after_kill(now) and run.first_ack_after is None:
                    run.first_ack_after = now
            return

    def _watch(self) -> None:
        """Until the kill: the latest moment up to which every write of the primary was on
        both replicas (read the primary's offset, then wait until both replicas, asked
        directly, have processed up to it)."""
        primary = redis.Redis(port=self.group.master_address()[1], socket_timeout=1)
        replicas = [redis.Redis(port=s.port, socket_timeout=1) for s in self.group.servers[1:]]
        try:
            while not self.stopping.is_set() and self.run.killed_at is None:
                started = time.monotonic()
                offset = int(primary.info("replication")["master_repl_offset"])
                while not all(self._has(r, offset) for r in replicas):
                    if self.stopping.is_set() or self.run.killed_at is not None:
                        return
                    time.sleep(0.002)
                with self.run.lock:
                    self.run.replicated_through = started
                time.sleep(0.005)
        except redis.RedisError:
            return  # the primary is gone
        finally:
            for c in (primary, *replicas):
                c.close()

    def _has(self, replica: redis.Redis, offset: int) -> bool:
        try:
            return int(replica.info("replication").get("slave_repl_offset", -1)) >= offset
        except redis.TimeoutError:  # frozen (SIGSTOP) by the test
            return False

    # -- waiting ---------------------------------------------------------------------

    def kill_primary(self) -> tuple[str, int]:
        """SIGKILL the primary; ``killed_at`` is taken once it is dead, so whatever returned
        after it was served by the new primary."""
        old = self.group.kill_primary()
        with self.run.lock:
            self.run.killed_at = time.monotonic()
        return old

    def backlog(self) -> int:
        """Publishes that returned and were not delivered yet."""
        with self.run.lock:
            return len(self.run.published.keys() - self.run.deliveries.keys())

    def delivered(self) -> int:
        with self.run.lock:
            return len(self.run.deliveries)

    def drained(self, survivor: redis.Redis) -> bool:
        """Whether the promoted primary holds nothing to deliver or in flight and every
        publish that returned after the kill was delivered."""
        stats = ReliableQueue(survivor, self.name, keeper=False, **self.options).stats()
        if any(int(stats.get(k, 0)) for k in ("ready", "in_flight", "delayed")):
            return False
        with self.run.lock:
            late = [p for p, at in self.run.published.items() if self.run.after_kill(at)]
            return all(p in self.run.deliveries for p in late)


def replicas_caught_up(group: RedisSentinelServers, timeout: float = 30.0) -> None:
    """Wait until every replica has processed every write the primary has made so far."""
    with redis.Redis(port=group.primary.port) as primary:
        offset = int(primary.info("replication")["master_repl_offset"])
    for server in group.servers:
        if server.port == group.primary.port:
            continue
        with redis.Redis(port=server.port) as replica:
            deadline = time.monotonic() + timeout
            while int(replica.info("replication").get("slave_repl_offset", -1)) < offset:
                assert time.monotonic() < deadline, f"replica {server.port} stays behind"
                time.sleep(0.01)


@contextlib.contextmanager
def replication_cut(group: RedisSentinelServers) -> Iterator[float]:
    """Cut replication until the block ends: what the primary takes meanwhile never reaches
    a replica, as on a replication link that breaks just before the primary dies. The
    replicas are frozen (SIGSTOP), so they cannot reconnect, and the primary closes their
    links (``CLIENT KILL TYPE replica``; what it had sent before stays in their sockets and
    is applied). Yields when the cut began (monotonic s); the replicas go on at the end."""
    replicas = [s.proc for s in group.servers[1:] if s.proc is not None]
    port = group.primary.port
    for proc in replicas:
        proc.send_signal(signal.SIGSTOP)
    try:
        with redis.Redis(port=port) as primary:
            primary.execute_command("CLIENT", "KILL", "TYPE", "replica")
        yield time.monotonic()
    finally:
        for proc in replicas:
            proc.send_signal(signal.SIGCONT)
