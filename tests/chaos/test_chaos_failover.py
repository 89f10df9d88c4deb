"""The chaos harness through Sentinel failovers, short: RQ (forking workers, belayq_rq) on a
primary with two replicas and three sentinels, with ``wait_replicas=1``, while the primary
is SIGKILLed and a replica promoted (twice or more) and workers are killed.

Fails if a task is lost (with ``wait_replicas=1`` nothing that was acknowledged may be
lost, and the harness's RQ producer WAITs for a replica after each enqueue), or completed
twice when no fault hit a process that held it (a failover hits every worker), or if the
failovers did not happen: each one must name a new primary, the killed server must come
back as a replica, and work must complete on the new primary after the last one.

The full comparison: ``python -m benchmarks.chaos --stack all --broker sentinel``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from belayq.embedded import redis_sentinel_command, redis_server_binary, system_redis_server
from benchmarks.chaos.faults import make_schedule
from benchmarks.chaos.report import details, table
from benchmarks.chaos.run import RunConfig, run_stack
from tests.conftest import unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SEED = 8  # kill-main, failover, failover (4 s after the first), kill-main, failover


def config(logdir: Path) -> RunConfig:
    return RunConfig(
        tasks=150,
        minutes=0.4,  # 24 s of faults, one every ~5 s
        seed=SEED,
        lease_s=2.0,
        sweep_s=0.25,
        fault_every_s=5.0,
        workers=2,
        long_share=0.02,
        eta_share=0.0,  # RQ's scheduler lock outlives a killed holder by 61 s: no delays here
        long_factor=1.5,
        drain_timeout_s=90.0,
        drain_stall_s=60.0,
        broker="sentinel",
        wait_replicas=1,
        logdir=logdir,
    )


@pytest.fixture(scope="module", autouse=True)
def _redis_available() -> None:
    try:
        redis_sentinel_command(system_redis_server() or redis_server_binary())
    except Exception as exc:
        unavailable(f"no redis-server / redis-sentinel: {exc}")


def test_rq_belayq_through_sentinel_failovers(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    plan = make_schedule(cfg.seed, cfg.duration_s, cfg.fault_every_s, ("failover", "kill-main"))
    assert sum(p.kind == "failover" for p in plan) >= 2, [p.kind for p in plan]
    r = run_stack("rq-belayq", cfg, plan, progress=False)
    print(f"\n{table([r])}\n\n{details(r)}")

    # The failovers happened: a new primary each time, the old one back as a replica.
    failovers = [f for f in r["fault_log"] if f["kind"] == "failover"]
    assert len(failovers) >= 2, r["faults_by_kind"]
    assert not r["faults_unverified"], f"faults not confirmed: {r['faults_unverified']}"
    for f in failovers:
        d = f["detail"]
        assert d["new_primary"] != d["old_primary"], d
        assert d["rejoined"], f"the killed primary did not come back as a replica: {d}"
    # Each failover starts from the primary the previous one promoted.
    for before, after in itertools.pairwise(failovers):
        assert after["detail"]["old_primary"] == before["detail"]["new_primary"]

    # The contract with wait_replicas=1: nothing lost, no duplicate without a fault.
    assert r["lost"] == 0, (
        f"lost {r['lost']} tasks ({r['lost_at_failover']} in a failover's window): "
        f"{r['lost_ids'][:20]} (still in {r['lost_where']})"
    )
    assert r["completed"] == r["published"] == cfg.tasks
    assert r["dup_not_at_fault"] == 0, r["dup_not_at_fault_detail"][:5]
    assert r["core_stats"] and not r["core_stats"].get("error"), r["core_stats"]
    assert r["core_stats"]["dead"] == 0 and r["core_stats"]["in_flight"] == 0, r["core_stats"]

    # The workers followed the new primary: work completed after the last failover.
    raw = json.loads((Path(r["logdir"]) / "ledger.json").read_text())
    last = failovers[-1]["t_end"]
    ran = [e for e in raw["executions"] if e["end"] is not None and e["start"] > last]
    assert ran, "no task ran after the last failover"
