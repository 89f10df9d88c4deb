"""The chaos harness, short: a few hundred tasks through real Celery (prefork), RQ
(forking) and Dramatiq (belayq's own keys over 3 shards) workers on belayq while every
fault kind is injected at least once: SIGKILL of a worker's main process, of a pool child /
work horse, of several workers at once, CLIENT KILL of the workers' connections, a restart
of the broker redis-server (AOF, appendfsync always) and a worker frozen with SIGSTOP past
its lease.

Fails if belayq loses a task (published, never completed) or completes one more than once
when no fault hit a process that held it. Each fault is checked to have happened (the pids
died, the Redis came back with a new run id, the worker was stopped, connections were
killed), so the test cannot pass without the chaos. No timing assertions: the deadlines
only bound the wait.

The full comparison with the stock stacks: ``python -m benchmarks.chaos --stack all``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from belayq.embedded import redis_server_binary, system_redis_server
from benchmarks.chaos.faults import KINDS, make_schedule
from benchmarks.chaos.report import details, table
from benchmarks.chaos.run import RunConfig, run_stack
from tests.conftest import unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SEED = 3


def config(logdir: Path) -> RunConfig:
    return RunConfig(
        tasks=240,
        minutes=0.5,  # 30 s of faults, one every ~2.5 s: about 12, the first six one of each
        seed=SEED,
        lease_s=2.0,
        sweep_s=0.25,
        fault_every_s=2.5,
        workers=3,
        concurrency=2,
        long_share=0.03,  # long tasks (2.5 leases), so kills and freezes catch work
        eta_share=0.06,
        long_factor=2.5,
        max_deliveries=50,
        drain_timeout_s=200.0,  # RQ's scheduler lock outlives a killed holder by 61 s
        drain_stall_s=150.0,
        ready_timeout_s=120.0,
        logdir=logdir,
    )


@pytest.fixture(scope="module", autouse=True)
def _redis_available() -> None:
    try:
        system_redis_server() or redis_server_binary()
    except Exception as exc:
        unavailable(f"no redis-server: {exc}")


@pytest.mark.parametrize("stack", ["celery-belayq", "rq-belayq", "dramatiq-belayq-shards"])
def test_chaos_short(stack: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    plan = make_schedule(cfg.seed, cfg.duration_s, cfg.fault_every_s)
    assert set(KINDS) <= {p.kind for p in plan}
    r = run_stack(stack, cfg, plan, progress=False)
    print(f"\n{table([r])}\n\n{details(r)}")

    # The chaos happened: every kind at least once, each one checked.
    missing = [k for k in KINDS if not r["faults_by_kind"].get(k)]
    assert not missing, f"fault kinds that never happened: {missing} ({r['faults_skipped_kinds']})"
    assert not r["faults_unverified"], f"faults not confirmed: {r['faults_unverified']}"
    log = r["fault_log"]
    restarts = [f for f in log if f["kind"] == "redis-restart"]
    assert all(f["detail"]["new_run_id"] != f["detail"]["old_run_id"] for f in restarts)
    kills = [f for f in log if f["kind"] in ("kill-main", "kill-child", "kill-many")]
    assert all(f["signalled"] for f in kills)
    assert sum(len(f["in_flight"]) for f in kills) > 0, "no kill caught a task in flight"
    assert r["workers_started"] > cfg.workers, "killed workers were replaced"

    # The contract: nothing lost, no duplicate without a fault that hit its holder.
    assert r["lost"] == 0, (
        f"belayq lost {r['lost']} tasks: {r['lost_ids'][:20]} (still in {r['lost_where']})"
    )
    assert r["completed"] == r["published"] == cfg.tasks
    assert r["dup_not_at_fault"] == 0, (
        f"duplicates of tasks no fault hit: {r['dup_not_at_fault_detail'][:5]}"
    )
    assert r["core_stats"] and not r["core_stats"].get("error"), r["core_stats"]
    assert r["core_stats"]["dead"] == 0 and r["core_stats"]["in_flight"] == 0, r["core_stats"]
