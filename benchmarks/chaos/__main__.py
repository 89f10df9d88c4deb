"""``python -m benchmarks.chaos``: run the chaos workload against one stack or all four."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from .faults import check_kinds, default_kinds, make_schedule
from .report import details, table
from .run import RunConfig, reanalyse, run_stack
from .servers import BROKERS
from .stacks import STACKS, unsupported

#: Workload presets: the share of tasks published with an ETA (0.5 to 3 leases ahead).
WORKLOADS = {"mixed": 0.05, "eta-heavy": 0.5}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    p.add_argument("--stack", default="all", help=f"one of {', '.join(STACKS)}, or all")
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--minutes", type=float, default=5.0, help="fault phase per stack")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--lease", type=float, default=5.0, help="belayq lease = stock visibility_timeout (s)"
    )
    p.add_argument("--sweep", type=float, default=0.5, help="belayq sweep interval (s)")
    p.add_argument("--fault-every", type=float, default=4.0, help="mean seconds between faults")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2, help="Celery prefork pool size")
    p.add_argument("--long-share", type=float, default=0.005)
    p.add_argument(
        "--eta-share",
        type=float,
        default=None,
        help="share of ETA/countdown tasks (default: the workload's)",
    )
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="mixed",
        help="mixed: 5%% ETA tasks; eta-heavy: half the tasks have an ETA",
    )
    p.add_argument("--long-factor", type=float, default=3.0, help="long task = N x lease")
    p.add_argument("--max-deliveries", type=int, default=50)
    p.add_argument("--drain-timeout", type=float, default=300.0)
    p.add_argument("--drain-stall", type=float, default=180.0)
    p.add_argument("--logdir", type=Path, default=Path("/tmp/belayq-chaos"))
    p.add_argument(
        "--broker",
        choices=BROKERS,
        default="single",
        help="single: one redis-server (AOF, restartable); sentinel: a primary, "
        "2 replicas and 3 sentinels; cluster: 3 masters + 3 replicas",
    )
    p.add_argument(
        "--wait-replicas",
        type=int,
        default=0,
        help="belayq stacks: publishes and settles wait for N replicas",
    )
    p.add_argument(
        "--kinds",
        default=None,
        help="fault kinds to inject (comma list; default: every kind the broker "
        "has: redis-restart on single, failover on sentinel and cluster)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="print the table and details of a saved --json file, run nothing",
    )
    p.add_argument(
        "--reanalyse",
        type=Path,
        nargs="+",
        default=None,
        metavar="LOGDIR",
        help="analyse finished runs again (their log directories), run nothing",
    )
    args = p.parse_args(argv)  # fmt: skip
    if args.eta_share is None:
        args.eta_share = WORKLOADS[args.workload]
    if args.reanalyse:
        again = [reanalyse(d) for d in args.reanalyse]
        print(table(again), "\n")
        for r in again:
            print(details(r), "\n")
        return 0
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print(saved.get("command", ""), "\n")
        print(table(saved["results"]), "\n")
        for r in saved["results"]:
            print(details(r), "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    stacks = list(STACKS) if args.stack == "all" else args.stack.split(",")
    for s in stacks:
        if s not in STACKS:
            p.error(f"unknown stack {s!r}")
    kinds = args.kinds.split(",") if args.kinds else list(default_kinds(args.broker))
    try:
        check_kinds(kinds, args.broker)
    except ValueError as exc:
        p.error(str(exc))
    reasons = {s: unsupported(s, args.broker, args.wait_replicas) for s in stacks}
    if args.stack != "all" and any(reasons.values()):
        p.error("; ".join(r for r in reasons.values() if r))
    for reason in filter(None, reasons.values()):
        logging.warning("skipped: %s", reason)
    stacks = [s for s in stacks if not reasons[s]]
    if not stacks:
        p.error("no stack can run here")
    cfg = RunConfig(
        tasks=args.tasks, minutes=args.minutes, seed=args.seed, lease_s=args.lease,
        sweep_s=args.sweep, fault_every_s=args.fault_every, workers=args.workers,
        concurrency=args.concurrency, long_share=args.long_share, eta_share=args.eta_share,
        long_factor=args.long_factor, max_deliveries=args.max_deliveries,
        drain_timeout_s=args.drain_timeout, drain_stall_s=args.drain_stall, logdir=args.logdir,
        broker=args.broker, wait_replicas=args.wait_replicas,
    )  # fmt: skip
    plan = make_schedule(cfg.seed, cfg.duration_s, cfg.fault_every_s, kinds)
    results = []
    t0 = time.time()
    for s in stacks:
        logging.info(
            "=== %s: %d tasks, %.1f min, %d faults planned", s, cfg.tasks, cfg.minutes, len(plan)
        )
        results.append(run_stack(s, cfg, plan))
        print(table(results[-1:]), file=sys.stderr)
        if args.json:
            _write(args.json, cfg, results, argv, t0)
    print()
    print(
        f"chaos: {cfg.tasks} tasks, {cfg.minutes} min of faults every ~{cfg.fault_every_s} s "
        f"(seed {cfg.seed}); belayq lease {cfg.lease_s} s, sweep {cfg.sweep_s} s; stock Celery "
        f"visibility_timeout {cfg.lease_s} s (stock default 3600 s); {cfg.workers} workers "
        f"(Celery prefork -c {cfg.concurrency}, acks_late, reject_on_worker_lost; RQ forking "
        f"Worker --with-scheduler); broker {cfg.broker}"
        + (f", wait_replicas={cfg.wait_replicas}" if cfg.wait_replicas else "")
    )
    print()
    print(table(results))
    print()
    for r in results:
        print(details(r))
        print()
    if args.json:
        _write(args.json, cfg, results, argv, t0)
    return 0


def _write(path: Path, cfg: RunConfig, results: list[dict[str, Any]],
           argv: list[str] | None, t0: float) -> None:  # fmt: skip
    path.write_text(json.dumps({
        "command": "python -m benchmarks.chaos " + " ".join(argv or sys.argv[1:]),
        "total_s": round(time.time() - t0, 1),
        "table": table(results),
        "results": results,
    }, indent=1, default=str))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
