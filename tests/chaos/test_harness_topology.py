"""The chaos harness's broker topologies without running them: which fault kinds and stacks
each one takes (the refusals say what to do), and how the analysis attributes loss and
duplicates to a failover, planned or not."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.chaos.analysis import Published, analyse, failover_windows
from benchmarks.chaos.faults import KINDS, Fault, check_kinds, default_kinds, make_schedule
from benchmarks.chaos.ledger import Execution
from benchmarks.chaos.stacks import unsupported


def test_the_single_broker_keeps_its_schedule_and_refuses_failover() -> None:
    assert default_kinds("single") == KINDS
    # The published single-broker tables were made with this exact schedule.
    assert make_schedule(1, 60, 4.0) == make_schedule(1, 60, 4.0, default_kinds("single"))
    with pytest.raises(ValueError, match="--broker sentinel or --broker cluster"):
        check_kinds(["kill-main", "failover"], "single")


@pytest.mark.parametrize("broker", ["sentinel", "cluster"])
def test_replicated_brokers_fail_over_instead_of_restarting(broker: str) -> None:
    assert "failover" in default_kinds(broker) and "redis-restart" not in default_kinds(broker)
    check_kinds(default_kinds(broker), broker)
    with pytest.raises(ValueError, match="redis-restart is a fault of --broker single only"):
        check_kinds(["redis-restart"], broker)
    with pytest.raises(ValueError, match="unknown fault kinds"):
        check_kinds(["fail-over"], broker)


def test_which_stacks_run_where() -> None:
    assert unsupported("celery-belayq", "sentinel") is None
    assert unsupported("celery-belayq", "cluster", wait_replicas=1) is None
    assert unsupported("rq-belayq", "sentinel", wait_replicas=1) is None
    assert unsupported("celery-stock", "sentinel") is None
    assert "Redis Cluster" in str(unsupported("celery-stock", "cluster"))
    assert "connection_pool" in str(unsupported("rq-belayq", "cluster"))
    assert "connection_pool" in str(unsupported("rq-stock", "cluster"))
    assert "belayq option" in str(unsupported("rq-stock", "sentinel", wait_replicas=1))
    assert "belayq option" in str(unsupported("celery-stock", "single", wait_replicas=1))
    assert unsupported("dramatiq-belayq", "sentinel", wait_replicas=1) is None
    assert unsupported("dramatiq-belayq-shards", "cluster", wait_replicas=1) is None
    assert unsupported("dramatiq-stock", "sentinel") is None
    assert "Redis Cluster refuses" in str(unsupported("dramatiq-stock", "cluster"))
    assert "belayq option" in str(unsupported("dramatiq-stock", "sentinel", wait_replicas=1))


def _failover(t: float, t_end: float, old: int, new: int) -> Fault:
    return Fault("failover", t, t_end, detail={"old_primary": old, "new_primary": new})


def test_loss_and_duplicates_at_planned_and_unplanned_failovers() -> None:
    planned = _failover(100.0, 104.0, 1, 2)
    switches: list[dict[str, Any]] = [
        {"t": 103.5, "old": 1, "new": 2, "sdown_t": 102.0, "demoted_t": None},  # the planned one
        {"t": 200.0, "old": 2, "new": 3, "sdown_t": 198.0, "demoted_t": 205.0},  # nobody's
    ]
    windows = failover_windows([planned], switches, down_after_s=2.0)
    assert [w[2] for w in windows] == [True, False]
    assert windows[1][0] == pytest.approx(198.0 - 2.0 - 1.0) and windows[1][1] == 205.0

    published = [
        Published("in-planned", "short", 0.01, 0.0, 99.5),  # acknowledged, then the kill
        Published("in-unplanned", "short", 0.01, 0.0, 203.0),  # written to the cut-off primary
        Published("elsewhere", "short", 0.01, 0.0, 150.0),  # no failover explains it
        Published("twice", "short", 0.01, 0.0, 199.0),
        Published("twice-quiet", "short", 0.01, 0.0, 300.0),
    ]
    executions = [
        Execution("twice", 1, 10, 199.1, 199.2, 9),
        Execution("twice", 2, 11, 206.0, 206.1, 9),
        Execution("twice-quiet", 1, 10, 300.1, 300.2, 9),
        Execution("twice-quiet", 2, 11, 310.0, 310.1, 9),
    ]
    r = analyse(published, executions, [planned], None, windows)
    assert r["lost"] == 3
    assert r["lost_at_failover"] == 2
    assert set(r["lost_at_failover_ids"]) == {"in-planned", "in-unplanned"}
    assert r["lost_at_unplanned_failover"] == 1
    assert r["failovers_unplanned"] == 1
    # The unplanned failover hit every worker: "twice" is explained, "twice-quiet" is not.
    assert r["dup_at_fault_by_kind"] == {"failover": 1}
    assert [d["task"] for d in r["dup_not_at_fault_detail"]] == ["twice-quiet"]
