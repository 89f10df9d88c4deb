"""The markdown table of a comparison (one row per stack)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .faults import KINDS

SHORT = {"kill-main": "main", "kill-child": "child", "kill-many": "many",
         "client-kill": "conn", "redis-restart": "restart", "freeze": "freeze"}  # fmt: skip


# The lines under a stack's table row that show only when their field is non-empty:
# (the field, the line).
NOTES: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("faults_unverified", lambda r: f"faults NOT verified: {r['faults_unverified']}"),
    ("duplicated",
     lambda r: f"duplicates at a fault, by the fault's kind: {r['dup_at_fault_by_kind']}"),
    ("dup_not_at_fault",
     lambda r: f"duplicates NOT in flight at any fault: {r['dup_not_at_fault_detail'][:5]}"),
    ("lost", lambda r: f"lost ({r['lost_never_started']} never started; still in "
                       f"{r['lost_where']}): {r['lost_ids'][:10]}"),
    ("unrecovered", lambda r: f"in flight at a kill and never started again: {r['unrecovered']}"),
    ("worker_events", lambda r: f"workers that exited by themselves: {len(r['worker_events'])}"),
    ("publish_errors", lambda r: f"publish errors (retried): {r['publish_errors']}"),
]


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| stack | tasks | faults (main/child/many/conn/restart/freeze) | completed | lost "
        "| duplicated (at a fault / not) | recovery p50 / p95 / max s (n) | stale acks refused "
        "| wall |"
    )
    rows = [head, "|" + "---|" * 9]
    for r in results:
        by = r["faults_by_kind"]
        faults = f"{r['faults']} ({'/'.join(str(by.get(k, 0)) for k in KINDS)})"
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
            f"| {r['stack']} | {r['published']} | {faults} | {r['completed']} | {r['lost']} "
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
    out += [f"- {note(r)}" for key, note in NOTES if r[key]]
    out.append(f"- core stats: {r['core_stats']}; stack stats: {r['stack_stats']}")
    return "\n".join(out)
