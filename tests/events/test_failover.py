"""Failover: a replica that missed the last writes of its primary is promoted.

Each test starts a primary and a replica (``--replicaof``) of its own. The history (see
``servers.run_history``) is replicated up to a checkpoint (``WAIT 1``); then replication is
cut (the replica follows a dead port) and the old primary takes more writes the replica
never gets: among them message M nacked and claimed again, so its token there moved on.
The replica is promoted and the clients' address (a forwarder, as a virtual IP) moves to
it. On the promoted node:

* no token handed out after the failover equals one handed out before it;
* settles with pre-failover tokens are refused (ack False, nack "stale", extend [False],
  release 0), counted in ``stale_acks``, and change nothing; the new holders' acks succeed;
* every message the replica had is ready, in flight, delayed or dead exactly once;
* the first calls work although the promoted node's script cache is empty;
* with ``wait_replicas=1`` every publish and settle that returned is on the replica when
  the primary is SIGKILLed right after it, and with the replica unreachable they raise
  ``DurabilityError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from tests.conftest import ON_BOTH

from .servers import (
    LEASE_MS,
    LONG_LEASE_MS,
    Forwarder,
    History,
    cached_scripts,
    check_nothing_lost,
    check_stale_refused,
    check_tokens_fresh,
    closing_all,
    cut,
    kill9,
    make_queue,
    promote,
    reclaim_all,
    reclaim_m_first,
    recover_everything,
    replicated,
    run_history,
    start_pair,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


@dataclass
class FailedOver:
    history: History
    queue: ReliableQueue  # made before the failover, through the forwarder: now on the replica
    promoted: redis.Redis  # a client of the promoted replica
    cached_scripts: int  # the promoted node's script cache right after the promotion


@pytest.fixture
def fail_over(
    start_server: Callable[..., RedisServer], qname: str
) -> Iterator[Callable[[], FailedOver]]:
    """Run the history on a fresh pair, cut replication at its checkpoint, promote the
    replica and move the forwarder to it."""
    opened: list[object] = []

    def run() -> FailedOver:
        primary, replica = start_pair(start_server)
        pc, rc = redis.Redis(port=primary.port), redis.Redis(port=replica.port)
        vip = Forwarder(primary.port)
        via_vip = redis.Redis(port=vip.port)
        opened.extend((pc, rc, via_vip, vip))
        writer = make_queue(pc, qname, lease_ms=LEASE_MS)
        after = make_queue(via_vip, qname, lease_ms=LONG_LEASE_MS)

        def checkpoint() -> None:
            replicated(pc)
            cut(rc)

        history = run_history(writer, checkpoint, lost_writes=True)
        promote(rc)
        vip.point_to(replica.port)
        return FailedOver(history, after, rc, cached_scripts(rc))

    with closing_all(opened):
        yield run


@ON_BOTH
def test_no_token_repeats_after_failover(fail_over: Callable[[], FailedOver]) -> None:
    fo = fail_over()
    q, h = fo.queue, fo.history
    got = recover_everything(q, h)
    check_tokens_fresh(h, got)


@ON_BOTH
def test_stale_settles_after_failover_are_refused(fail_over: Callable[[], FailedOver]) -> None:
    fo = fail_over()
    q, h = fo.queue, fo.history
    assert h.m_lost is not None
    # While M's old lease runs, M is held under the token the replica has: the token of the
    # claim the promoted node never saw is refused.
    assert q.ack(h.m_lost) is False, "ack with a token the promoted node never saw"
    got = recover_everything(q, h)
    check_stale_refused(q, h, got)


FIRST_CALLS = ("stale_ack", "claim", "publish", "ack_and_claim", "stats")


@pytest.mark.parametrize("first", FIRST_CALLS)
def test_first_calls_on_promoted_node_work(
    fail_over: Callable[[], FailedOver], qname: str, first: str
) -> None:
    fo = fail_over()
    q, h = fo.queue, fo.history
    assert h.m_lost is not None and h.m_kept is not None
    if fo.cached_scripts:  # Redis < 7 replicated SCRIPT LOAD; 7.x does not
        fo.promoted.script_flush()
    assert cached_scripts(fo.promoted) == 0
    # The queue object was made before the failover (its scripts were loaded on the old
    # primary only) and the move dropped its connections: its first call must work.
    extra: set[str] = set()
    held = []
    if first == "stale_ack":
        assert q.ack(h.m_lost) is False
    elif first == "claim":
        held = q.claim(timeout=5, count=3)
        assert len(held) == 3 and h.m_kept.id not in {d.id for d in held}
    elif first == "publish":
        extra.add(q.publish("after the failover"))
    elif first == "ack_and_claim":
        acked, held = q.ack_and_claim([h.m_lost], count=2)
        assert acked == [False] and len(held) == 2
    else:
        assert q.stats()["in_flight"] == 1  # M, under the token the replica has
    # Everything the replica had is still there exactly once, and settles normally.
    fresh = make_queue(fo.promoted, qname, lease_ms=LONG_LEASE_MS)
    held += q.claim(timeout=0, count=100) + fresh.claim(timeout=0, count=100)
    h2 = replace(h, present=h.present | extra)
    m = reclaim_m_first(fresh, replace(h2, lost_writes=False))
    got_all = reclaim_all(fresh, h2, [m, *held])
    check_nothing_lost(fresh, h2, got_all)
    assert fresh.ack_many(got_all) == [True] * len(got_all)


def wait_calls(client: redis.Redis) -> int:
    """How many WAIT commands the server has run (INFO commandstats)."""
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


@ON_BOTH
def test_wait_replicas_makes_writes_survive_primary_kill(
    start_server: Callable[..., RedisServer], qname: str
) -> None:
    primary, replica = start_pair(start_server)
    pc, rc = redis.Redis(port=primary.port), redis.Redis(port=replica.port)
    with closing_all([pc, rc]):
        q = make_queue(pc, qname, lease_ms=LEASE_MS, wait_replicas=1, wait_timeout_ms=5000)
        waits0 = wait_calls(pc)
        ids = [q.publish(f"w{i}") for i in range(100)]
        ids += q.publish_many([f"wm{i}" for i in range(100)], batch=25)
        ids.append(q.publish("w-delayed", delay_ms=500))
        claimed = q.claim(timeout=5, count=30)
        assert len(claimed) == 30
        assert q.ack_many(claimed[:10]) == [True] * 10
        for d in claimed[10:15]:
            assert q.nack(d, delay_ms=0, reason="again") == "ready"
        assert q.extend(claimed[15:20]) == [True] * 5
        assert q.release(claimed[20:25]) == 5
        waits = wait_calls(pc) - waits0
        kill9(primary)  # right after the last settle returned (and one INFO)
        # At least one WAIT per call: 101 publishes, publish_many, ack_many, 5 nacks,
        # extend, release.
        assert waits >= 101 + 1 + 1 + 5 + 1 + 1, f"only {waits} WAITs ran"
        promote(rc)
        after = make_queue(rc, qname, lease_ms=LONG_LEASE_MS)
        h = History(present=set(ids) - {d.id for d in claimed[:10]}, lost_writes=False)
        got = reclaim_all(after, h, [])
        check_nothing_lost(after, h, got)
        assert after.ack_many(got) == [True] * len(got)


@ON_BOTH
def test_wait_replicas_raises_durability_error_when_replica_unreachable(
    start_server: Callable[..., RedisServer], qname: str
) -> None:
    from belayq.errors import DurabilityError

    primary, replica = start_pair(start_server)
    pc, rc = redis.Redis(port=primary.port), redis.Redis(port=replica.port)
    with closing_all([pc, rc]):
        # Healthy pair: confirmed in time (a generous timeout: the machine may be loaded).
        patient = make_queue(
            pc, qname, lease_ms=LONG_LEASE_MS, wait_replicas=1, wait_timeout_ms=10_000
        )
        patient.publish_many([f"d{i}" for i in range(4)])
        q = make_queue(pc, qname, lease_ms=LONG_LEASE_MS, wait_replicas=1, wait_timeout_ms=200)
        held = q.claim(timeout=5, count=4)
        assert len(held) == 4
        cut(rc)
        wait_for(
            lambda: int(replication_of(pc).get("connected_slaves", 0)) == 0,
            "the primary to notice that its replica left",
        )
        # An extend does not wait for replicas: a failover that loses it costs nothing
        # (the lease is only shorter), and waiting could let a live holder's lease lapse.
        start = time.monotonic()
        assert q.extend([held[2]]) == [True]
        assert time.monotonic() - start < 0.2 * 5, "the extend waited for a replica"
        calls: list[tuple[str, Callable[[], object]]] = [
            ("publish", lambda: q.publish("unconfirmed")),
            ("ack", lambda: q.ack(held[0])),
            ("nack", lambda: q.nack(held[1], delay_ms=0)),
            ("release", lambda: q.release([held[2], held[3]])),
        ]
        for what, call in calls:
            start = time.monotonic()
            try:
                outcome = call()
            except DurabilityError:
                pass
            else:
                pytest.fail(f"{what} returned {outcome!r} although no replica confirmed it")
            took = time.monotonic() - start
            assert took < 5, f"{what} waited {took:.1f} s with wait_timeout_ms=200"


def replication_of(client: redis.Redis) -> dict[str, object]:
    return dict(client.info("replication"))
