"""From the ledger, the published tasks and the fault log to the figures of one stack:
published, completed, lost, duplicated (in flight at a fault or not), recovery latency."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from .faults import GLOBAL, KILLS, Fault
from .ledger import Execution

# A process holds a message from its claim to its ack, and the ledger only sees the run in
# between. After the run: Celery's main process acks after the pool child returns, and
# belayq sends the acks of one event-loop iteration together. Before it: a prefetched
# message waits in the worker (a frozen worker runs what it had prefetched right after
# SIGCONT). So an execution counts as held during [start - HOLD_GRACE_S, end + ACK_GRACE_S];
# for a delayed (ETA) task from its publish, since a worker may hold it until it is due.
# A worker woken from a freeze longer than the lease runs the backlog it had prefetched
# (stale copies: their leases expired and were redelivered) for a while after SIGCONT, so
# for a freeze the hold reaches further back.
ACK_GRACE_S = 2.0
HOLD_GRACE_S = 2.0
FREEZE_BACKLOG_S = 10.0
# A failover to an async replica can lose what the primary had acknowledged but not yet
# streamed to it (replication on one machine lags by milliseconds; under load, more). A
# lost task published at most this long before a failover's kill (or while it lasted) is
# counted as lost "in a failover's window" apart from the other losses.
FAILOVER_LOSS_WINDOW_S = 1.0
# A change of primary nobody planned (Sentinel failed over a primary it could not reach
# for down-after ms, though it ran): the old primary took writes from the moment the
# sentinels stopped hearing it until they turned it into a replica, and its resync threw
# them away. Without a logged demotion, the window ends this long after the switch.
UNPLANNED_WINDOW_AFTER_S = 10.0


def failover_windows(
    faults: list[Fault], switches: list[dict[str, Any]], down_after_s: float
) -> list[list[Any]]:
    """``[start, end, planned, old port, new port]`` for each change of primary: the
    harness's failovers (from ``FAILOVER_LOSS_WINDOW_S`` before the kill to the new
    primary) and the switches the sentinels logged that none of them explains (from
    ``down_after_s`` + ``FAILOVER_LOSS_WINDOW_S`` before the first ``+sdown`` to the
    demotion)."""
    planned = [f for f in faults if f.kind == "failover"]
    out: list[list[Any]] = [
        [f.t - FAILOVER_LOSS_WINDOW_S, f.t_end, True, f.detail.get("old_primary"),
         f.detail.get("new_primary")]
        for f in planned
    ]  # fmt: skip
    for sw in switches:
        if any(
            f.detail.get("old_primary") == sw["old"] and f.t - 1 <= sw["t"] <= f.t_end + 5
            for f in planned
        ):
            continue
        seen = sw["sdown_t"] if sw["sdown_t"] is not None else sw["t"]
        end = sw["demoted_t"] if sw["demoted_t"] is not None else sw["t"] + UNPLANNED_WINDOW_AFTER_S
        out.append([seen - down_after_s - FAILOVER_LOSS_WINDOW_S, end, False, sw["old"], sw["new"]])
    return out


# When several faults hit a duplicated task, it is counted under the first of these.
EXPLAINS = ("kill-main", "kill-many", "kill-child", "freeze", "redis-restart", "failover",
            "client-kill")  # fmt: skip


@dataclass
class Published:
    task_id: str
    kind: str  # short | long | eta
    seconds: float
    delay_s: float
    t: float
    publish_errors: int = 0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(q * (len(values) - 1))))
    return values[k]


def _hits(f: Fault, ex: Execution, p: Published | None) -> bool:
    """Whether fault ``f`` hit the process of execution ``ex`` while it held the message."""
    # The worker's main process (the execution's parent) holds the message of a pool child
    # or work horse; a fault that hit it hit the message (kill-child hits only the child).
    holder_hit = ex.ppid in f.pids and f.kind != "kill-child"
    if f.kind not in GLOBAL and ex.pid not in f.pids and not holder_hit:
        return False
    held_from = ex.start - (FREEZE_BACKLOG_S if f.kind == "freeze" else HOLD_GRACE_S)
    if p is not None and p.delay_s > 0:
        held_from = min(held_from, p.t)
    held_to = float("inf") if ex.end is None else ex.end + ACK_GRACE_S
    return held_from <= f.t_end and held_to >= f.t


def analyse(
    published: list[Published],
    executions: list[Execution],
    faults: list[Fault],
    waiting: dict[str, list[str]] | None = None,
    windows: list[list[Any]] | None = None,
) -> dict[str, Any]:
    """The figures of one stack. ``waiting``: ids the framework still keeps at the end
    (RQ's scheduled and failed registries), to say where lost tasks are; ``windows``: the
    changes of primary (:func:`failover_windows`; default: the failover faults')."""
    by_task: dict[str, list[Execution]] = defaultdict(list)
    for ex in executions:
        by_task[ex.task_id].append(ex)
    pub = {p.task_id: p for p in published}
    completions = {t: [e for e in exs if e.end is not None] for t, exs in by_task.items()}
    completed = {t for t, ends in completions.items() if ends}
    lost = sorted(set(pub) - completed)
    dups = sorted(t for t, ends in completions.items() if len(ends) > 1)

    if windows is None:
        windows = failover_windows(faults, [], 0.0)
    # A failover nobody planned hits every worker too (acks the old primary took are gone).
    explaining = faults + [
        Fault("failover", w[0], w[1], detail={"unplanned": True}) for w in windows if not w[2]
    ]
    dup_at_fault: Counter[str] = Counter()  # by the strongest fault kind that explains it
    dup_publish: list[str] = []
    dup_breach: list[dict[str, Any]] = []
    dup_detail: list[dict[str, Any]] = []
    for t in dups:
        hit = sorted(
            {(EXPLAINS.index(f.kind), f.kind, round(f.t, 3)) for f in explaining
             for ex in by_task[t] if _hits(f, ex, pub.get(t))}
        )  # fmt: skip
        detail = {
            "task": t,
            "kind": pub[t].kind if t in pub else "?",
            "faults": [[k, at] for _i, k, at in hit],
            "executions": [[e.attempt, e.pid, e.start, e.end] for e in by_task[t]],
        }
        dup_detail.append(detail)
        if hit:
            dup_at_fault[hit[0][1]] += 1
        elif pub.get(t) and pub[t].publish_errors:
            dup_publish.append(t)
        else:
            dup_breach.append(detail)

    recovery: list[float] = []
    unrecovered: list[dict[str, Any]] = []
    finished_anyway = 0
    by_key = {(e.task_id, e.attempt): e for e in executions}
    for f in faults:
        if f.kind not in KILLS:
            continue
        for task_id, attempt, pid, _start in f.in_flight:
            held = by_key.get((task_id, attempt))
            if held is not None and held.end is not None:
                finished_anyway += 1  # e.g. a work horse that outlived its killed parent
                continue
            again = [e.start for e in by_task[task_id] if e.start > f.t and e.pid != pid]
            if again:
                recovery.append(min(again) - f.t)
            elif completions.get(task_id):
                finished_anyway += 1  # another copy (e.g. one a frozen worker held) completed
            else:
                unrecovered.append({"fault": f.kind, "t": f.t, "task": task_id})

    lost_failover = [
        t for t in lost if t in pub and any(w[0] <= pub[t].t <= w[1] for w in windows)
    ]  # fmt: skip
    lost_unplanned = [
        t for t in lost_failover if not any(w[2] and w[0] <= pub[t].t <= w[1] for w in windows)
    ]  # fmt: skip
    faults_by_kind = Counter(f.kind for f in faults)
    unverified = [f.kind for f in faults if not f.verified]
    starts = Counter(e.task_id for e in executions)
    return {
        "published": len(pub),
        "published_by_kind": dict(Counter(p.kind for p in published)),
        "publish_errors": sum(p.publish_errors for p in published),
        "completed": len(completed & set(pub)),
        "lost": len(lost),
        "lost_ids": lost[:200],
        "lost_never_started": sum(1 for t in lost if t not in by_task),
        "lost_at_failover": len(lost_failover),
        "lost_at_failover_ids": lost_failover[:200],
        "lost_at_unplanned_failover": len(lost_unplanned),
        "failovers_unplanned": sum(1 for w in windows if not w[2]),
        "failover_windows": windows,
        "lost_where": {name: len(set(ids) & set(lost)) for name, ids in (waiting or {}).items()},
        "duplicated": len(dups),
        "dup_at_fault": sum(dup_at_fault.values()),
        "dup_at_fault_by_kind": dict(dup_at_fault),
        "dup_publish_retry": len(dup_publish),
        "dup_not_at_fault": len(dup_breach),
        "dup_not_at_fault_detail": dup_breach[:50],
        "dup_detail": dup_detail[:200],
        "executions": len(executions),
        "re_executions": sum(n - 1 for n in starts.values() if n > 1),
        "faults": len(faults),
        "faults_by_kind": dict(faults_by_kind),
        "faults_unverified": unverified,
        "recovery_n": len(recovery),
        "recovery_p50_s": percentile(recovery, 0.5),
        "recovery_p95_s": percentile(recovery, 0.95),
        "recovery_max_s": max(recovery) if recovery else None,
        "recovery_mean_s": statistics.fmean(recovery) if recovery else None,
        "in_flight_at_kill_finished_anyway": finished_anyway,
        "unrecovered": len(unrecovered),
        "unrecovered_detail": unrecovered[:50],
        "ack_grace_s": ACK_GRACE_S,
        "hold_grace_s": HOLD_GRACE_S,
        "freeze_backlog_s": FREEZE_BACKLOG_S,
        "failover_loss_window_s": FAILOVER_LOSS_WINDOW_S,
    }
