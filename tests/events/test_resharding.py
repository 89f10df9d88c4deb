"""Resharding: the slot of a busy queue moves to another master, key by key, under load.

A 3-master Redis Cluster of this test only. While a producer publishes (every 10th message
delayed), two consumers claim and ack (nacking some first deliveries, dead-lettering a few
poison messages) and a sweeper sweeps (lease 2 s, so expired leases are swept back), the
queue's slot is migrated as ``redis-cli --cluster reshard`` does it: ``SETSLOT IMPORTING``
on the target, ``SETSLOT MIGRATING`` on the source, then ``GETKEYSINSLOT`` + ``MIGRATE`` one
key at a time with small pauses, then ``SETSLOT NODE`` on all three masters.

The clients retry ``ConnectionLost`` (counted); the core retries cluster redirections and
TRYAGAIN itself. Afterwards (producer stopped, consumers drained, delayed messages due,
swept): every published message was acked exactly once or is a dead letter, never both,
none lost; the sizes are 0 (but dead); every key of the queue lives on the target.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from belayq import ConnectionLost, Delivery, ReliableQueue
from belayq.embedded import RedisClusterServers
from tests import support
from tests.conftest import ON_BOTH

from .servers import closing_all, make_queue, sizes, wait_for

pytestmark = pytest.mark.timeout(150)

LEASE_MS = 2000
MIGRATION_S = 1.5  # the pauses between keys add up to about this (split-slot window)
WORK_S = 0.015  # per message: the consumers about keep up with the producer
BACKLOG = 300  # published before the load starts: every list and set of the queue exists
RETRY_S = 30.0  # a call is retried on ConnectionLost for this long at most


class Load:
    """The producer, two consumers and a sweeper, each with its own cluster client."""

    def __init__(self, make_client: Callable[[], RedisCluster], name: str) -> None:
        self.make_client = make_client
        self.name = name
        self.lock = threading.Lock()
        self.published: set[str] = set()  # payloads whose publish returned
        self.maybe: set[str] = set()  # payloads whose publish raised
        self.acked: Counter[str] = Counter()  # payload -> acks that returned True
        self.buried: Counter[str] = Counter()  # payload -> dead_letter calls that returned True
        self.retries: Counter[str] = Counter()  # ConnectionLost per call kind
        self.unexpected: list[str] = []
        self.abandoned = 0
        self.swept: Counter[str] = Counter()  # what the sweeper's sweeps did
        self.stop_producer = threading.Event()
        self.stop_all = threading.Event()
        self.threads: list[threading.Thread] = []
        self.clients: list[RedisCluster] = []
        self.queues: list[ReliableQueue] = []

    def queue(self, *, keeper: bool = False) -> ReliableQueue:
        client = self.make_client()
        q = make_queue(client, self.name, lease_ms=LEASE_MS, max_deliveries=20, keeper=keeper)
        with self.lock:
            self.clients.append(client)
            self.queues.append(q)
        return q

    def call(self, what: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, result), or (False, None) after an error that is not ConnectionLost, or
        after retrying ConnectionLost for RETRY_S."""
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                return True, fn()
            except ConnectionLost:
                with self.lock:
                    self.retries[what] += 1
                if time.monotonic() > deadline:
                    self.note(f"{what}: ConnectionLost for {RETRY_S} s")
                    return False, None
                time.sleep(0.05)
            except Exception as exc:  # the test reports it; the thread carries on
                self.note(f"{what}: {type(exc).__name__}: {exc}")
                time.sleep(0.05)
                return False, None

    def note(self, problem: str) -> None:
        with self.lock:
            self.unexpected.append(problem)

    def start(self) -> None:
        for target in (self.produce, self.consume, self.consume_abandoning, self.sweep):
            t = threading.Thread(target=self.guard, args=(target,), daemon=True)
            self.threads.append(t)
            t.start()

    def guard(self, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:
            self.note(f"thread {target.__name__} died: {type(exc).__name__}: {exc}")

    def produce(self) -> None:
        q = self.queue()
        n = 0
        while not self.stop_producer.is_set():
            n += 1
            payload = f"p{n}"
            delay = 1000 if n % 10 == 0 else 0
            ok, _ = self.call("publish", lambda p=payload, d=delay: q.publish(p, delay_ms=d))
            with self.lock:
                (self.published if ok else self.maybe).add(payload)
            time.sleep(0.008)

    def consume(self) -> None:
        """As in production: the lease keeper extends what the consumer holds and runs the
        fleet-wide guarded sweep."""
        self.run_consumer(keeper=True, abandon=False)

    def consume_abandoning(self) -> None:
        """No keeper; walks away from the first delivery of every 13th message, as a worker
        that died with it: the lease expires and a sweep (or claim) brings it back."""
        self.run_consumer(keeper=False, abandon=True)

    def run_consumer(self, *, keeper: bool, abandon: bool) -> None:
        q = self.queue(keeper=keeper)
        while not self.stop_all.is_set():
            ok, got = self.call("claim", lambda: q.claim(timeout=0.2, count=5))
            for d in got or []:
                time.sleep(WORK_S)
                if abandon and int(d.payload[1:]) % 13 == 0 and d.deliveries == 1:
                    with self.lock:
                        self.abandoned += 1
                    continue
                self.settle(q, d)

    def settle(self, q: ReliableQueue, d: Delivery) -> None:
        payload = d.payload.decode()
        n = int(payload[1:])
        if poison(payload):
            ok, res = self.call("dead_letter", lambda: q.dead_letter(d, "poison"))
            if ok and res is True:
                with self.lock:
                    self.buried[payload] += 1
        elif n % 7 == 0 and d.deliveries == 1:
            delay = 150 if n % 2 else 0
            self.call("nack", lambda: q.nack(d, delay_ms=delay, reason="first try fails"))
        else:
            ok, res = self.call("ack", lambda: q.ack(d))
            if ok and res is True:
                with self.lock:
                    self.acked[payload] += 1

    def sweep(self) -> None:
        q = self.queue()
        while not self.stop_all.is_set():
            ok, res = self.call("sweep", q.sweep)
            if ok:
                with self.lock:
                    self.swept.update(reclaimed=res.reclaimed, promoted=res.promoted)
            self.stop_all.wait(0.25)

    def join(self) -> None:
        self.stop_producer.set()
        self.stop_all.set()
        for t in self.threads:
            t.join(RETRY_S + 10)
        for q in self.queues:
            q.close(release=False)
        for c in self.clients:
            c.close()


def poison(payload: str) -> bool:
    """Every 23rd message is dead-lettered by the consumers on its first delivery."""
    return int(payload[1:]) % 23 == 0


def node_id(node: redis.Redis) -> str:
    raw = node.execute_command("CLUSTER", "MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def queue_keys(node: redis.Redis, name: str) -> list[bytes]:
    return list(node.scan_iter(match=f"*{name}*", count=1000))


def migrate_slot(
    slot: int, src: redis.Redis, dst: redis.Redis, dst_port: int, other: redis.Redis
) -> dict[str, Any]:
    """Move ``slot`` from ``src`` to ``dst`` key by key (as ``redis-cli --cluster reshard``)."""
    src_id, dst_id = node_id(src), node_id(dst)
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    total = int(src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
    pause = min(0.2, max(0.001, MIGRATION_S / max(1, total)))
    moved, busy, gone = 0, [], 0
    start = time.monotonic()
    while True:
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if not keys:
            break
        # The server's order is arbitrary; shortest name first moves a queue's fixed keys
        # before any per-message key, so the slot stays split for as long as possible
        # between keys one script may touch.
        for key in sorted(keys, key=lambda k: (len(k), k)):
            try:
                reply = src.execute_command(
                    "MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "KEYS", key
                )
            except redis.ResponseError as exc:
                if "BUSYKEY" not in str(exc):
                    raise
                # The target already has a key of that name: something created it there
                # while the source still held it. Keep the source's (the reshard tool's
                # --cluster-replace) and report it.
                busy.append(key)
                reply = src.execute_command(
                    "MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "REPLACE", "KEYS", key
                )
            if reply in (b"NOKEY", "NOKEY"):
                gone += 1  # expired meanwhile
            else:
                moved += 1
            time.sleep(pause)
    for node in (dst, src, other):
        node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return {
        "keys_at_start": total,
        "moved": moved,
        "expired": gone,
        "busykey": busy,
        "took_s": round(time.monotonic() - start, 2),
    }


@ON_BOTH
def test_queue_slot_migrates_under_load(
    start_cluster: Callable[[], RedisClusterServers], qname: str
) -> None:
    cluster = start_cluster()
    startup = [ClusterNode(h, p) for h, p in cluster.startup_nodes]
    nodes = [redis.Redis(port=n.port) for n in cluster.nodes]
    opened: list[Any] = list(nodes)
    with closing_all(opened):
        main = make_queue(RedisCluster(startup_nodes=startup), qname, lease_ms=LEASE_MS)
        opened.append(main.client)
        # A backlog, so that every key of the queue exists (the ready list is never empty).
        backlog = [f"p{-i}" for i in range(BACKLOG)]
        main.publish_many(backlog)
        slots = {key_slot(k) for n in nodes for k in queue_keys(n, qname)}
        assert len(slots) == 1, f"the queue's keys are on slots {slots}"
        slot = slots.pop()
        counts = [int(n.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) for n in nodes]
        holders = [i for i, c in enumerate(counts) if c]
        assert len(holders) == 1, f"keys of slot {slot} per node: {counts}"
        s = holders[0]
        d, o = (s + 1) % 3, (s + 2) % 3
        src, dst, other = nodes[s], nodes[d], nodes[o]

        load = Load(lambda: RedisCluster(startup_nodes=startup), qname)
        load.published.update(backlog)
        load.start()
        try:
            wait_for(lambda: len(load.acked) >= 50, "the load to get going")
            report = migrate_slot(slot, src, dst, cluster.nodes[d].port, other)
            n_at_migration = len(load.published)
            wait_for(
                lambda: len(load.published) >= n_at_migration + 50 and len(load.acked) > 0,
                "the load to go on after the migration",
                timeout=30,
            )
            load.stop_producer.set()
            time.sleep(0.05)

            def drained() -> bool:
                ok, dead = load.call("dead_letters", lambda: main.dead_letters(100_000))
                if not ok:
                    return False
                done = set(load.acked) | {x.payload.decode() for x in dead if x.payload}
                ok, sz = load.call("stats", lambda: sizes(main))
                busy = not ok or sz["ready"] or sz["in_flight"] or sz["delayed"]
                return not busy and load.published <= done

            with_drain = True
            try:
                support.wait_for(drained, 25, "the consumers to drain the queue", step=0.2)
            except AssertionError:
                with_drain = False
        finally:
            load.join()

        main.sweep()
        dead = main.dead_letters(100_000)
        final = sizes(main)
        dead_payloads = Counter(x.payload.decode() for x in dead if x.payload)
        no_payload = [(x.id, x.reason) for x in dead if not x.payload]
        everything = load.published | load.maybe
        outcomes = {p: load.acked[p] + dead_payloads[p] for p in everything}
        lost = sorted(p for p in load.published if outcomes[p] == 0)
        twice = sorted(p for p, n in outcomes.items() if n > 1)
        both = sorted(p for p in everything if load.acked[p] and dead_payloads[p])
        keys = {i: len(queue_keys(n, qname)) for i, n in enumerate(nodes)}
        summary = (
            f"published {len(load.published)} (+{len(load.maybe)} unsure), acked "
            f"{sum(load.acked.values())}, dead {len(dead)}, migration {report}, "
            f"ConnectionLost retries {dict(load.retries)}, abandoned {load.abandoned}, "
            f"sweeper {dict(load.swept)}, sizes {final}"
        )
        print("\n" + summary)
        problems = []
        if lost:
            problems.append(f"{len(lost)} published messages lost: {lost[:20]}")
        if twice:
            problems.append(f"{len(twice)} acked/dead more than once: {twice[:20]}")
        if both:
            problems.append(f"{len(both)} both acked and dead: {both[:20]}")
        not_poison = [
            (x.payload, x.reason) for x in dead if x.payload and not poison(x.payload.decode())
        ]
        if not_poison:
            problems.append(f"{len(not_poison)} dead letters were no poison: {not_poison[:5]}")
        if no_payload:
            problems.append(f"{len(no_payload)} dead letters lost their payload: {no_payload[:5]}")
        if not with_drain:
            problems.append("the queue did not drain within 25 s")
        if final != {"ready": 0, "in_flight": 0, "delayed": 0, "dead": len(dead)}:
            problems.append(f"sizes at the end: {final}")
        if keys[s] or keys[o] or not keys[d]:
            problems.append(f"queue keys per node (source {s}, target {d}): {keys}")
        if report["busykey"]:
            problems.append(f"keys created on the target mid-migration: {report['busykey'][:10]}")
        if load.unexpected:
            shown = Counter(load.unexpected).most_common(8)
            problems.append(f"{len(load.unexpected)} unexpected errors: {shown}")
        assert not problems, summary + "\n" + "\n".join(problems)
