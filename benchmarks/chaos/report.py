"""The markdown table of a comparison (one row per stack)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .faults import ALL_KINDS, KINDS

SHORT = {"kill-main": "main", "kill-child": "child", "kill-many": "many",
         "client-kill": "conn", "redis-restart": "restart", "freeze": "freeze",
         "failover": "failover"}  # fmt: skip


# The lines under a stack's table row that show only when their field is non-empty:
# (the field, the line).
NOTES: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("faults_unverified", lambda r: f"faults NOT verified: {r['faults_unverified']}"),
    (
        "duplicated",
        lambda r: f"duplicates at a fault, by the fault's kind: {r['dup_at_fault_by_kind']}",
    ),
    (
        "dup_not_at_fault",
        lambda r: f"duplicates NOT in flight at any fault: {r['dup_not_at_fault_detail'][:5]}",
    ),
    (
        "lost",
        lambda r: (
            f"lost ({r['lost_never_started']} never started; "
            f"{r.get('lost_at_failover', 0)} published in a failover's window; "
            f"still in {r['lost_where']}): {r['lost_ids'][:10]}"
        ),
    ),
    ("unrecovered", lambda r: f"in flight at a kill and never started again: {r['unrecovered']}"),
    ("worker_events", lambda r: f"workers that exited by themselves: {len(r['worker_events'])}"),
    ("publish_errors", lambda r: f"publish errors (retried): {r['publish_errors']}"),
]


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(results: list[dict[str, Any]]) -> str:
    """One row per stack. With a replicated broker (or any failover) the faults column
    counts failovers too, the stack names its broker, and ``lost`` says how many of the
    lost tasks were published in a failover's window."""
    replicated = any(r.get("broker", "single") != "single" or r["faults_by_kind"].get("failover")
                     for r in results)  # fmt: skip
    kinds = ALL_KINDS if replicated else KINDS
    head = (
        f"| stack | tasks | faults ({'/'.join(SHORT[k] for k in kinds)}) | completed | lost "
        + ("(in a failover's window) " if replicated else "")
        + "| duplicated (at a fault / not) | recovery p50 / p95 / max s (n) "
        "| stale acks refused | wall |"
    )
    rows = [head, "|" + "---|" * 9]
    for r in results:
        by = r["faults_by_kind"]
        faults = f"{r['faults']} ({'/'.join(str(by.get(k, 0)) for k in kinds)})"
        lost = f"{r['lost']}"
        if replicated:
            lost += f" ({r.get('lost_at_failover', 0)})"
        if r.get("failovers_unplanned"):
            faults += f" +{r['failovers_unplanned']} unplanned failover(s)"
        name = r["stack"]
        if r.get("broker", "single") != "single":
            name += f" ({r['broker']}"
            name += f", wait_replicas={r['wait_replicas']})" if r.get("wait_replicas") else ")"
        dup = f"{r['duplicated']} ({r['dup_at_fault']} / {r['dup_not_at_fault']})"
        if r.get("dup_publish_retry"):
            dup += f" +{r['dup_publish_retry']} publish retried"
        rec = (
            f"{_s(r['recovery_p50_s'])} / {_s(r['recovery_p95_s'])} / {_s(r['recovery_max_s'])}"
            f" ({r['recovery_n']}"
            + (f", {r['unrecovered']} never" if r["unrecovered"] else "")
            + ")"
        )
        stale = "n/a (stock)" if r["core_stats"] is None else str(r.get("stale_acks") or 0)
        rows.append(
            f"| {name} | {r['published']} | {faults} | {r['completed']} | {lost} "
            f"| {dup} | {rec} | {stale} | {r['wall_s']:.0f} s |"
        )
    return "\n".join(rows)


def details(r: dict[str, Any]) -> str:
    """A few lines per stack under the table: what to look at."""
    out = [f"**{r['stack']}** (run {r['run']}, logs {r['logdir']})"]
    out.append(
        f"- published by kind {r['published_by_kind']}; executions {r['executions']} "
        f"(re-executions {r['re_executions']}); fault phase {r['fault_phase_s']} s, "
        f"drain {r['drain_s']} s, drained: {r['drained']}; workers started "
        f"{r['workers_started']}; faults skipped (no target) {r['faults_skipped']}"
    )
    outages = [
        f["detail"].get("outage_s", f["detail"].get("stop_s", 0) + f["detail"].get("down_s", 0))
        for f in r["fault_log"]
        if f["kind"] == "redis-restart"
    ]
    if outages:
        out.append(
            f"- broker restarts: {len(outages)}, outage (stop to PONG) max {max(outages):.2f} s"
        )
    failovers = [f["detail"] for f in r["fault_log"] if f["kind"] == "failover"]
    if failovers:
        gaps = [d.get("no_primary_s") for d in failovers if d.get("no_primary_s") is not None]
        moves = [f"{d.get('old_primary')}->{d.get('new_primary', '?')}" for d in failovers]
        out.append(
            f"- failovers: {len(failovers)} ({', '.join(moves)}); without a primary "
            f"max {max(gaps, default=0):.2f} s, mean {sum(gaps) / max(len(gaps), 1):.2f} s; "
            f"replica lag before the kill (bytes): "
            f"{[d.get('lag_bytes_before') for d in failovers]}"
        )
    if r.get("failovers_unplanned"):
        unplanned = [w for w in r["failover_windows"] if not w[2]]
        out.append(
            f"- failovers nobody planned (the sentinels lost a running primary for down-after "
            f"ms): {r['failovers_unplanned']}; tasks lost in their windows: "
            f"{r.get('lost_at_unplanned_failover', 0)}; windows {unplanned}"
        )
    out += [f"- {note(r)}" for key, note in NOTES if r[key]]
    out.append(f"- core stats: {r['core_stats']}; stack stats: {r['stack_stats']}")
    return "\n".join(out)
