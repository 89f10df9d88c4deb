"""A primary that a failover demotes while clients are still connected to it (``SENTINEL
FAILOVER``; a partition that heals): its answers (``READONLY`` to writes and scripts,
``UNBLOCKED`` to a blocked BLMOVE) are reconnects, ``ConnectionLost``, never a raw
``ResponseError``; a Sentinel-managed client goes on on the new primary, and so do its
lease keeper and its blocked claims.

Sentinel reconfigures the demoted primary as a replica only when its next INFO round
notices it (about 10 s); the tests send that ``REPLICAOF`` themselves right after the
promotion, as Sentinel would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from belayq import ConnectionLost, ReliableQueue
from belayq.claim_any import claim_any
from belayq.embedded import RedisSentinelServers
from tests.support import wait_for

from .harness import master_client

pytestmark = pytest.mark.timeout(120)

LONG_S = 30.0


def fail_over(group: RedisSentinelServers) -> tuple[tuple[str, int], tuple[str, int]]:
    """Fail over with ``SENTINEL FAILOVER``: a replica is promoted and the old primary stays
    up, still a primary until Sentinel reconfigures it. Returns (old, new) addresses."""
    old = group.master_address()
    with redis.Redis(port=group.primary.port) as primary:
        assert int(primary.execute_command("WAIT", 2, 5000)) == 2, "replicas behind"
    with redis.Redis(port=group.sentinel_addresses[0][1]) as sentinel:
        sentinel.execute_command("SENTINEL", "FAILOVER", group.service_name)
    return old, group.wait_for_new_primary(old, timeout=LONG_S)


def demote(old: tuple[str, int], new: tuple[str, int]) -> None:
    """Make the old primary a replica of the new one, as Sentinel does when it notices."""
    with redis.Redis(port=old[1]) as demoted:
        demoted.execute_command("REPLICAOF", *new)
        wait_for(lambda: demoted.info("replication")["role"] == "slave", LONG_S, "demotion")


class Blocked(threading.Thread):
    """Runs ``call`` (a claim that blocks) and keeps its outcome or exception; with
    ``until_got``, calls again after ``ConnectionLost`` or an empty claim (as a consumer
    does) until one returns something or ``LONG_S`` pass, keeping the errors."""

    def __init__(self, call: Callable[[], Any], *, until_got: bool = False) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.until_got = until_got
        self.outcome: Any = None
        self.error: BaseException | None = None
        self.errors: list[BaseException] = []

    def run(self) -> None:
        deadline = time.monotonic() + LONG_S
        while True:
            try:
                self.outcome = self.call()
            except BaseException as exc:
                self.error = exc
                if not (self.until_got and isinstance(exc, ConnectionLost)):
                    return
                self.errors.append(exc)
            if not self.until_got or self.outcome or time.monotonic() > deadline:
                return


def server_ms(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds * 1000 + micros / 1000


def blocked_in_blmove(client: redis.Redis, expected: int) -> None:
    """Wait until ``expected`` clients of the server are blocked (in BLMOVE)."""
    wait_for(
        lambda: int(client.info("clients")["blocked_clients"]) >= expected,
        LONG_S,
        "the claims to block",
    )


def test_plain_client_of_a_demoted_primary_gets_connection_lost(
    sentinel_servers: RedisSentinelServers, qname: str
) -> None:
    """A client that is not Sentinel-managed (a fixed address): every call the demoted
    node refuses is ``ConnectionLost``, including claims blocked at the moment it changed
    role; the connections are dropped, so a moved address would be found."""
    group = sentinel_servers
    plain = redis.Redis(port=group.primary.port, socket_timeout=10)
    try:
        q = ReliableQueue(plain, qname, keeper=False)
        other = ReliableQueue(plain, f"{qname}-other", keeper=False)
        q.publish("held")
        held = q.claim(timeout=1)
        assert len(held) == 1
        claimers = [
            Blocked(lambda: q.claim(timeout=20)),
            Blocked(lambda: claim_any([q, other], timeout=20)),
        ]
        for c in claimers:
            c.start()
        blocked_in_blmove(plain, 2)
        demote(*fail_over(group))
        for c in claimers:
            c.join(LONG_S)
            assert isinstance(c.error, ConnectionLost), (c.outcome, c.error)
        calls: dict[str, Callable[[], Any]] = {
            "publish": lambda: q.publish("after"),
            "ack": lambda: q.ack(held[0]),
            "extend": lambda: q.extend(held),
            "claim": lambda: q.claim(timeout=0),
            "claim_any": lambda: claim_any([q, other], timeout=0),
            "sweep": q.sweep,
        }
        for what, call in calls.items():
            with pytest.raises(ConnectionLost, match="left the primary role"):
                call()
                pytest.fail(f"{what} returned on a demoted primary")
    finally:
        plain.close()


def test_sentinel_client_moves_to_the_new_primary_with_its_keeper(
    sentinel_servers: RedisSentinelServers, qname: str
) -> None:
    """A Sentinel-managed client across a failover that leaves the old primary up: the
    lease keeper extends the held claim on the new primary before the old one is demoted
    (it asks the sentinels on each beat), so the claim's ack succeeds and it is never
    redelivered; consumers blocked on the old primary get ``ConnectionLost`` when it is
    demoted, and their next claims are served by the new primary."""
    group = sentinel_servers
    # The claim's holder on a client of its own: only its keeper uses it from now on.
    client = master_client(group, socket_timeout=10)
    waiting = master_client(group, socket_timeout=10)
    try:
        q = ReliableQueue(client, qname, lease_ms=5000, sweep_interval_ms=200)
        q.publish("held")
        held = q.claim(timeout=1)
        assert len(held) == 1
        w = ReliableQueue(waiting, qname, keeper=False)
        other = ReliableQueue(waiting, f"{qname}-other", keeper=False)
        claimers = [
            Blocked(lambda: w.claim(timeout=5), until_got=True),
            Blocked(lambda: claim_any([w, other], timeout=5), until_got=True),
        ]
        for c in claimers:
            c.start()
        with redis.Redis(port=group.primary.port) as primary:
            blocked_in_blmove(primary, 2)
        old, new = fail_over(group)
        promoted_at = time.monotonic()
        with redis.Redis(port=new[1]) as promoted, redis.Redis(port=old[1]) as stale:
            deadline = promoted.zscore(q.keys.leases, held[0].id)
            assert deadline is not None, "the held claim's lease is not on the new primary"
            wait_for(
                lambda: (promoted.zscore(q.keys.leases, held[0].id) or 0) > deadline,
                LONG_S,
                "the keeper to extend the claim on the new primary",
            )
            moved_s = time.monotonic() - promoted_at
            old_role = stale.info("replication")["role"]
            print(f"\n[demotion] the keeper moved {moved_s:.2f} s after the promotion")
            assert old_role == "master", (
                "the keeper stayed on the old primary until Sentinel demoted it"
            )
            demote(old, new)
            # The consumers blocked on the old primary now wait on the new one.
            published = {q.publish("for a claimer"), q.publish("for the other")}
            for c in claimers:
                c.join(LONG_S)
            got = [d for c in claimers for d in c.outcome or []]
            assert {d.id for d in got} == published, [(c.outcome, c.error) for c in claimers]
            assert all(len(c.outcome) == 1 for c in claimers)
            assert w.ack_many(got) == [True, True]
            # Past the deadline the old primary gave: the claim lives only if the keeper
            # extends it on the new node.
            wait_for(lambda: server_ms(promoted) > deadline + 500, LONG_S, "the old deadline")
            assert q.sweep().reclaimed == 0
            assert q.ack_many(held) == [True]
            assert promoted.llen(q.keys.ready) == 0
            assert q.stats()["in_flight"] == 0
    finally:
        client.close()
        waiting.close()
