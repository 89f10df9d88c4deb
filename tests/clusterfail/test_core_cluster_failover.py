"""The core through a cluster failover: a master of a 3-master, 3-replica cluster (started
by the ``failover_cluster`` fixture) stops serving the queue's slot while a producer
publishes with ``wait_replicas=1`` and four consumers claim (two blocked in
``ReliableQueue.claim``, two in ``claim_any``), with their lease keepers running.

* ``CLUSTER FAILOVER`` on its replica (a clean handover): nothing lost, nothing run twice;
  consumers blocked in BLMOVE on the old master are answered (UNBLOCKED) and go on with
  the new one without a restart. A publish in the moment before the old master's
  replication link to the new one is up may raise ``DurabilityError`` (and is consumed).
* SIGKILL of the master: after ``cluster-node-timeout`` (1500 ms) its replica takes over.
  Every message whose publish returned is consumed; a message runs twice only if it was in
  flight at the kill (at most one per consumer). Until the killed node comes back (we
  restart it, as a supervisor would; it rejoins as the replica of the promoted one), the
  promoted master has no replica: publishes and acks raise ``DurabilityError`` after
  ``wait_timeout_ms`` (never hang), and their writes are still there.

The seconds without service (the event -> the ack of the first message claimed after it)
are printed.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ReliableQueue
from belayq.embedded import RedisClusterServers
from tests.conftest import ON_BOTH
from tests.support import wait_for

from .conftest import cluster_client
from .load import Load

pytestmark = pytest.mark.timeout(90)

WAIT_TIMEOUT_MS = 500
OPTIONS: dict[str, Any] = {
    "wait_replicas": 1,
    "wait_timeout_ms": WAIT_TIMEOUT_MS,
    "lease_ms": 3000,
    "sweep_interval_ms": 500,
}
CONSUMERS = 4


@pytest.fixture
def load(failover_cluster: RedisClusterServers) -> Iterator[Load]:
    running = Load(failover_cluster, f"cf-{uuid.uuid4().hex[:8]}", OPTIONS, CONSUMERS)
    try:
        yield running.start()
    finally:
        running.close()


def warm_up(load: Load) -> None:
    wait_for(lambda: len(load.runs) >= 50, 20, "50 messages consumed before the event")


def drain(load: Load, cluster: RedisClusterServers) -> None:
    """Stop publishing, wait until every message is consumed and the queue is empty, then
    stop the consumers."""
    load.stop_publishing.set()
    load.threads[0].join(10)
    written = load.written()
    client = cluster_client(cluster)
    load.clients.append(client)
    probe = ReliableQueue(client, load.name, keeper=False, **OPTIONS)

    def empty() -> bool:
        s = probe.stats()
        done = written <= set(load.consumed())
        return done and not (int(s["ready"]) or int(s["in_flight"]) or int(s["delayed"]))

    wait_for(empty, 30, lambda: f"the queue to drain: {probe.stats()}")
    load.stop_consuming.set()


def report(what: str, load: Load, gap_s: float, extra: str = "") -> dict[str, int]:
    consumed = load.consumed()
    figures = {
        "confirmed": len(load.confirmed),
        "unconfirmed": len(load.unconfirmed),
        "uncertain": len(load.uncertain),
        "runs": len(load.runs),
        "lost": len(set(load.confirmed) - set(consumed)),
        "duplicates": sum(n - 1 for n in consumed.values()),
    }
    print(
        f"\n[{what}] {figures}; without service {gap_s:.2f} s {extra}; errors {dict(load.errors)}"
    )
    return figures


def check_contract(load: Load) -> dict[str, int]:
    assert not load.crashed, f"a producer or consumer thread crashed: {load.crashed}"
    consumed = load.consumed()
    lost = set(load.confirmed) - set(consumed)
    assert not lost, f"{len(lost)} confirmed message(s) never consumed: {sorted(lost)[:10]}"
    ghosts = set(consumed) - load.written() - set(load.uncertain)
    assert not ghosts, f"consumed but never published: {sorted(ghosts)[:10]}"
    return {p: n for p, n in consumed.items() if n > 1}


def test_manual_failover_loses_nothing_and_runs_nothing_twice(
    failover_cluster: RedisClusterServers, load: Load
) -> None:
    cluster = failover_cluster
    warm_up(load)
    master = cluster.master_of_key(load.queue().keys.ready)
    replica = cluster.replica_of(master)
    t_event = time.monotonic()
    cluster.manual_failover(replica)
    assert cluster.master_of_key(load.queue().keys.ready) is replica
    wait_for(lambda: load.first_run_after(t_event), 15, "a claim and ack after the failover")
    first = load.first_run_after(t_event)
    assert first is not None
    gap = first.acked_at - t_event
    wait_for(
        lambda: load.consumers_after(t_event) == set(range(CONSUMERS)),
        15,
        lambda: f"every consumer to claim again; these did: {load.consumers_after(t_event)}",
    )
    assert load.alive(), "a consumer stopped"
    drain(load, cluster)
    twice = check_contract(load)
    figures = report(
        "CLUSTER FAILOVER", load, gap, f"(first claim {first.claimed_at - t_event:.2f} s)"
    )
    assert not twice, f"a clean handover ran messages twice: {twice}"
    # The old master turns into the new one's replica at once, but its link takes a moment:
    # a publish or two right after the switch may find no replica connected yet.
    assert figures["uncertain"] == 0, load.errors
    late = [(p, round(t0 - t_event, 2)) for p, t0, _ in load.unconfirmed if t0 - t_event > 2]
    assert not late, f"publishes unconfirmed long after the handover: {late}"
    assert gap < 5, f"{gap:.2f} s without service after a clean handover"


@ON_BOTH
def test_killed_master_loses_nothing_confirmed(
    failover_cluster: RedisClusterServers, load: Load
) -> None:
    cluster = failover_cluster
    warm_up(load)
    master = cluster.master_of_key(load.queue().keys.ready)
    replica = cluster.replica_of(master)
    t_event = time.monotonic()
    cluster.kill(master)
    t_killed = time.monotonic()  # claims returning until now may have run on the old master
    promoted_s = cluster.wait_promoted(replica)
    wait_for(lambda: load.first_run_after(t_event), 20, "a claim and ack after the kill")
    first = load.first_run_after(t_event)
    assert first is not None
    gap = first.acked_at - t_event

    # The promoted master has no replica: durable writes fail clearly, and fast.
    t_promoted = time.monotonic()
    refused_after = lambda: [took for _, t0, took in load.unconfirmed if t0 > t_promoted]  # noqa: E731
    wait_for(lambda: len(refused_after()) >= 2, 15, "publishes refused for want of a replica")
    slowest = max(refused_after())
    assert slowest < WAIT_TIMEOUT_MS / 1000 + 2.5, f"a refused publish took {slowest:.2f} s"
    assert load.errors["publish DurabilityError"] == len(load.unconfirmed), load.errors
    said = load.messages["publish DurabilityError"]
    assert "0 of 1 replica(s)" in said and "0 replica(s) connected" in said, said

    # The killed node comes back (a supervisor restarts it) as the new master's replica.
    master.start()
    wait_for(lambda: cluster.role(master) == "slave", 20, "the old master to rejoin as replica")
    confirmed_at_restart = len(load.confirmed)
    wait_for(
        lambda: len(load.confirmed) >= confirmed_at_restart + 30,
        20,
        "durable publishes to succeed again",
    )
    wait_for(
        lambda: load.consumers_after(t_event) == set(range(CONSUMERS)),
        15,
        lambda: f"every consumer to claim again; these did: {load.consumers_after(t_event)}",
    )
    assert load.alive(), "a consumer stopped"
    drain(load, cluster)
    twice = check_contract(load)
    assert not load.uncertain, load.errors  # the core rode out the failover window
    in_flight = load.in_flight_at(t_event)
    report(
        "SIGKILL master",
        load,
        gap,
        f"(replica promoted {promoted_s:.2f} s after the kill, first claim "
        f"{first.claimed_at - t_event:.2f} s; {len(in_flight)} in flight at the kill)",
    )
    # Only a delivery in flight at the kill (claimed, not yet acked on a replica) may run
    # again; each consumer holds one at a time. (With this 3 s lease, shorter than the
    # failover, they do: their leases expire before the keeper reaches the new master. With
    # a lease longer than the failover, runs measured none.)
    # A claim whose reply came back while the kill was under way ran on the old master too.
    claimed_before_death = {r.payload for r in list(load.runs)
                            if r.claimed_at <= t_killed and r.acked_at > t_event}
    assert set(twice) <= in_flight | claimed_before_death, (twice, in_flight, claimed_before_death)
    assert all(n == 2 for n in twice.values()), twice
    assert len(in_flight) <= CONSUMERS, in_flight
    assert gap < 15, f"{gap:.2f} s without service after the kill"


def _info(cluster: RedisClusterServers, node: Any, section: str) -> dict[str, Any]:
    return dict(cluster._cmd(node, "INFO", section))


def _calls(cluster: RedisClusterServers, node: Any) -> Counter[str]:
    stats = _info(cluster, node, "commandstats")
    return Counter({k: int(v["calls"]) for k, v in stats.items()})


@pytest.mark.parametrize("event", ["CLUSTER FAILOVER", "SIGKILL"])
def test_idle_blocked_consumers_follow_the_slot_without_polling(
    failover_cluster: RedisClusterServers, event: str
) -> None:
    """Two idle consumers, blocked in BLMOVE on the queue's master (one in ``claim``, one in
    ``claim_any``): after ``CLUSTER FAILOVER`` (or the master's SIGKILL) both block on the
    new master, which sees only a handful of calls while they wait (no polling), and a
    message published then reaches a consumer at once."""
    import threading

    cluster = failover_cluster
    name = f"cf-idle-{uuid.uuid4().hex[:6]}"
    clients = [cluster_client(cluster) for _ in range(3)]
    producer, *queues = (ReliableQueue(c, name) for c in clients)
    got: list[tuple[float, bytes]] = []
    stop = threading.Event()

    def consume(i: int) -> None:
        q = queues[i]
        while not stop.is_set():
            for d in claim_any([q], timeout=30) if i else q.claim(timeout=30):
                got.append((time.monotonic(), d.payload))
                q.ack(d)

    from belayq.claim_any import claim_any

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        master = cluster.master_of_key(producer.keys.ready)
        replica = cluster.replica_of(master)
        blocked = lambda node: int(_info(cluster, node, "clients")["blocked_clients"])  # noqa: E731
        wait_for(lambda: blocked(master) == 2, 10, "both consumers blocked on the master")
        t0 = time.monotonic()
        if event == "SIGKILL":
            cluster.kill(master)
            cluster.wait_promoted(replica)
        else:
            cluster.manual_failover(replica)
        wait_for(lambda: blocked(replica) == 2, 15, "both consumers blocked on the new master")
        moved_s = time.monotonic() - t0
        before = _calls(cluster, replica)
        time.sleep(1.0)
        # What the consumers send (commandstats also counts the commands scripts run).
        sent = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_blmove")
        idle_calls = sum((_calls(cluster, replica) - before)[k] for k in sent)
        # Each consumer's keeper sweeps once a second; a BLMOVE round lasts up to 4 s.
        assert idle_calls <= 6, f"{idle_calls} claims and scripts in 1 s of waiting: polling?"
        t_pub = time.monotonic()
        producer.publish(b"after")
        wait_for(lambda: got, 5, "the message published after the handover")
        pickup_s = got[0][0] - t_pub
        print(
            f"\n[idle, {event}] blocked again on the new master {moved_s:.2f} s after the "
            f"event; {idle_calls} calls in 1 s idle; pickup {pickup_s * 1000:.0f} ms"
        )
        assert [p for _, p in got] == [b"after"]
        assert pickup_s < 1.0, f"pickup took {pickup_s:.2f} s"
    finally:
        stop.set()
        producer.publish_many([b"stop", b"stop"])  # wake both consumers
        for t in threads:
            t.join(10)
        for c in clients:
            c.close()
