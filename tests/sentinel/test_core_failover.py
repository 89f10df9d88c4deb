"""The core through a Sentinel failover: the primary is SIGKILLed under load and the
sentinels promote a replica; producers and consumers on Sentinel-managed clients
(``Sentinel(...).master_for(name)``) carry on without a restart.

* Without ``wait_replicas``: a publish may be lost only if it returned after the last
  moment up to which both replicas had every write of the primary (asynchronous
  replication's window; ``harness.Traffic._watch`` measures it), and the count is printed.
* With ``wait_replicas=1``: nothing that was published is lost.
* Both: a message is delivered twice only if it was in flight at the kill (claimed before
  it, and its ack had not returned, or had not reached the replicas), or, when the
  sentinels promoted a second time under load, was claimed on the first new primary and
  its ack returned False (or its publish raised, and was sent again to the second new
  primary, which never had it); no thread sees an error other than
  ``ConnectionLost``/``DurabilityError``; every thread works on the new primary; the
  recovery time (kill to the first claim and ack on the new primary) is printed (bound:
  60 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis

from belayq.embedded import RedisSentinelServers
from tests.conftest import ON_BOTH
from tests.support import wait_for

from .harness import Run, Traffic, replication_cut

pytestmark = pytest.mark.timeout(120)

#: Deliveries before the kill, and after the recovery, before the producer stops.
BEFORE_KILL = 150
AFTER_RECOVERY = 150
#: How long replication is cut right before the kill (s).
CUT_S = 0.3
#: Messages waiting (replicated) when the cut begins.
BACKLOG = 30
#: Upper bound of each wait; the recovery itself takes a few seconds.
LONG_S = 60.0


@dataclass
class Outcome:
    run: Run
    lost: list[str]
    duplicated: list[str]
    recovery_s: float
    promoted_s: float
    #: The primary the sentinels name at the end, when it is not the one first promoted:
    #: under load they may deem the new primary down too and promote again.
    moved_again_to: tuple[str, int] | None = None


def fail_over(
    start_sentinels: Callable[..., RedisSentinelServers], name: str, **options: object
) -> Outcome:
    """Run the traffic, SIGKILL the primary mid-run, let the sentinels promote a replica,
    keep the traffic on until it works on the new primary, then drain the queue."""
    group = start_sentinels()
    traffic = Traffic(group, name, **options).start()
    try:
        wait_for(lambda: traffic.delivered() >= BEFORE_KILL, LONG_S, "traffic before the kill")
        wait_for(lambda: traffic.run.replicated_through, LONG_S, "a replication mark")
        old = kill_after_cut(group, traffic)
        killed = traffic.run.killed_at
        assert killed is not None
        new = group.wait_for_new_primary(old, timeout=LONG_S)
        promoted_s = time.monotonic() - killed
        run = traffic.run
        wait_for(
            lambda: run.first_claim_after and run.first_ack_after and run.first_publish_after,
            LONG_S,
            lambda: f"the threads to work on the new primary {new}; errors {dict(run.errors)}",
        )
        seen = traffic.delivered()
        wait_for(lambda: traffic.delivered() >= seen + AFTER_RECOVERY, LONG_S, "more traffic")
        traffic.producing.clear()
        final = group.master_address()
        with redis.Redis(port=final[1]) as survivor:
            wait_for(lambda: traffic.drained(survivor), LONG_S, "the queue to drain")
    finally:
        traffic.stop()
    assert not traffic.crashed, f"a thread died: {traffic.crashed!r}"
    assert run.first_claim_after is not None and run.first_ack_after is not None
    recovery_s = max(run.first_claim_after, run.first_ack_after) - killed
    lost = sorted(p for p in run.published if p not in run.deliveries)
    duplicated = sorted(p for p, ds in run.deliveries.items() if len(ds) > 1)
    out = Outcome(run, lost, duplicated, recovery_s, promoted_s,
                  moved_again_to=final if final != new else None)
    report(name, out)
    return out


def kill_after_cut(group: RedisSentinelServers, traffic: Traffic) -> tuple[str, int]:
    """SIGKILL the primary at the end of a replication cut of ``CUT_S``
    (:func:`~.harness.replication_cut`): first the consumers pause until a backlog builds
    (replicated); during the cut they claim from it and hold their batches (claims the
    replicas never see) while the producer goes on (publishes the replicas never see);
    after the kill the consumers ack what they hold."""
    traffic.consuming.clear()
    wait_for(lambda: traffic.backlog() >= BACKLOG, LONG_S, "a backlog")
    traffic.holding.set()
    try:
        with replication_cut(group) as cut_at:
            traffic.consuming.set()
            wait_for(lambda: traffic.holders == 2, LONG_S, "both consumers to hold a batch")
            time.sleep(max(0.0, cut_at + CUT_S - time.monotonic()))  # the window's length
            return traffic.kill_primary()
    finally:
        traffic.holding.clear()
        traffic.consuming.set()


def report(title: str, out: Outcome) -> None:
    run = out.run
    assert run.killed_at is not None
    window_ms = (run.killed_at - run.replicated_through) * 1000
    in_window = sum(
        1 for at in run.published.values() if run.replicated_through <= at < run.killed_at
    )
    print(
        f"\n[sentinel failover, {title}] published {len(run.published)}, delivered "
        f"{len(run.deliveries)}, lost {len(out.lost)} (published in the last {window_ms:.0f} "
        f"ms before the kill, not yet on both replicas: {in_window}), delivered twice "
        f"{len(out.duplicated)}; promoted {out.promoted_s:.2f} s after the kill, first claim "
        f"and ack on it {out.recovery_s:.2f} s after; errors seen {dict(run.errors)}"
        + (f"; promoted again, to {out.moved_again_to}" if out.moved_again_to else "")
    )


def check_duplicates(out: Outcome, settled_before: float) -> None:
    """Every message delivered twice was in flight at the kill: claimed before it, and not
    acked by ``settled_before`` (an ack that returned later may not be on the replica).

    When the sentinels promoted a second time (``out.moved_again_to``), a claim made on the
    first new primary may also be redelivered: claims do not wait for replicas, so one the
    next primary never got is undone with it. Its holder learns it: the ack returns False.
    Unless the next primary never got the message at all: its publish raised (unconfirmed),
    so the producer published it again there, and an ack of a message a server does not
    hold answers True (as a re-sent ack whose first run settled it does).
    """
    run = out.run
    assert run.killed_at is not None
    for p in out.duplicated:
        first = run.deliveries[p][0]
        if out.moved_again_to is not None and first.at > run.killed_at:
            assert first.refused or p in run.unsure, (
                f"{p}, claimed on the first new primary and published without an error, "
                f"was delivered again, yet its ack returned True: {run.deliveries[p]}"
            )
            continue
        assert first.at <= run.killed_at, (
            f"{p} was first claimed {first.at - run.killed_at:.3f} s after the kill, and "
            f"delivered again: {run.deliveries[p]}"
        )
        assert first.acked_at is None or first.acked_at >= settled_before, (
            f"{p} was acked {run.killed_at - first.acked_at:.3f} s before the kill (settled on "
            f"the replicas), and delivered again: {run.deliveries[p]}"
        )


def test_failover_without_wait_replicas_loses_only_the_unreplicated_window(
    start_sentinels: Callable[..., RedisSentinelServers], qname: str
) -> None:
    out = fail_over(start_sentinels, f"{qname}-async")
    run = out.run
    assert out.lost, "the cut before the kill should have lost the publishes it held"
    early = [p for p in out.lost if run.published[p] < run.replicated_through]
    assert not early, (
        f"lost although both replicas had every write made before they returned: {early}"
    )
    check_duplicates(out, run.replicated_through)
    assert out.recovery_s < LONG_S


@ON_BOTH
def test_failover_with_wait_replicas_loses_nothing(
    start_sentinels: Callable[..., RedisSentinelServers], qname: str
) -> None:
    # A 6 s lease: on a loaded machine the sentinels may name no primary for a few seconds
    # after the promotion (they may even deem the new one down and promote again).
    out = fail_over(start_sentinels, f"{qname}-wait", wait_replicas=1, wait_timeout_ms=1000,
                    lease_ms=6000)
    run = out.run
    assert not out.lost, f"{len(out.lost)} published message(s) lost: {out.lost[:20]}"
    assert run.killed_at is not None
    check_duplicates(out, run.killed_at)
    assert out.recovery_s < LONG_S
