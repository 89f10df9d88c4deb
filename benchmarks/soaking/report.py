"""What the soak found: every task judged against its plan (done, failed in its framework,
dead-lettered, or lost), the memory and keys at start and at the end, and the verdict."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from belayq.discovery import list_queues, open_found

from .census import Group
from .ledger import LEDGER

#: What each framework does with a task that planned to fail for good.
FAILED_IN = {"celery": "ledger", "rq": "rq failed registry", "dramatiq": "dead letters"}


@dataclass
class Tasks:
    sent: int = 0
    by_end: Counter[str] = field(default_factory=Counter)  # done, failed, dead
    waiting: list[str] = field(default_factory=list)  # not at their end (yet)
    lost: list[str] = field(default_factory=list)  # final: never to reach it
    # final: meant to succeed, but failed in its framework (an RQ job in RQ's failed
    # registry): not lost, yet a defect all the same
    failed_unplanned: list[str] = field(default_factory=list)
    runs: int = 0
    planned_runs: int = 0  # the runs the plans ask for (retries, a poison's deliveries)
    ran_twice: int = 0  # completed more than once
    dead_letters: int = 0


def dead_letter_ids(r: redis.Redis) -> set[str]:
    """The ids of every dead letter on the server: belayq's, and the framework's own (a
    Celery envelope's task id, a Dramatiq message's ``message_id``), read through each queue
    as recorded."""
    ids: set[str] = set()
    for found in list_queues(r):
        q = open_found(r, found)
        for d in q.dead_letters(limit=100_000):
            ids.add(d.id)
            if d.payload and d.payload.startswith(b"{"):
                with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                    body = json.loads(d.payload)
                    # a Celery envelope's task id, a Dramatiq message's id
                    ids.add(str(body["headers"]["id"] if "headers" in body
                                else body["message_id"]))
    return ids


def planned_runs(framework: str, plan: str, max_deliveries: int) -> int:
    """How many runs a task's plan asks for when no fault hits it."""
    if plan.startswith("retry:"):
        return int(plan.split(":", 1)[1]) + 1
    if plan == "dead":
        return {"rq": max_deliveries, "dramatiq": 3}.get(framework, 1)
    return 1


def judge_tasks(sent: dict[str, tuple[str, str, float]], lr: redis.Redis, r: redis.Redis,
                queues: dict[str, str], *, final: bool, max_deliveries: int = 5) -> Tasks:
    """Each task sent against the ledger (and, ``final``, the framework's failed and dead
    records): where it ended, or that it has not."""
    outcomes: dict[str, list[str]] = {}
    ends = lr.lrange(LEDGER + "ends", 0, -1)
    for raw in ends:
        task_id, _attempt, _pid, outcome = json.loads(raw)
        outcomes.setdefault(task_id, []).append(outcome)
    t = Tasks(sent=len(sent), runs=sum(int(v) for v in lr.hvals(LEDGER + "attempts")))
    dead = dead_letter_ids(r) if final else set()
    t.dead_letters = len(dead)
    rq_failed = f"rq:failed:{queues['rq']}"
    for task_id, (framework, plan, _delay) in sent.items():
        seen = outcomes.get(task_id, [])
        t.planned_runs += planned_runs(framework, plan, max_deliveries)
        t.ran_twice += seen.count("ok") > 1
        if plan in ("fail", "dead"):
            if framework == "rq":
                there = r.zscore(rq_failed, task_id) is not None
                end = "failed" if there else None
            elif framework == "celery" and plan == "fail":
                end = "failed" if "failed" in seen else None
            else:  # a Celery rejection, a Dramatiq message out of retries: dead letters
                planned = 3 if (framework == "dramatiq" and plan == "dead") else 1
                ran = seen.count("failed") + seen.count("rejected") >= planned
                end = "dead" if ran and (not final or task_id in dead) else None
                if final and ran and task_id not in dead:
                    t.lost.append(task_id)
                    continue
        else:
            end = "done" if "ok" in seen else None
            if (end is None and final and framework == "rq"
                    and r.zscore(rq_failed, task_id) is not None):
                t.failed_unplanned.append(task_id)
                continue
        if end is None:
            (t.lost if final else t.waiting).append(task_id)
        else:
            t.by_end[end] += 1
    return t


@dataclass
class Outcome:
    minutes: float
    rate: float
    workers: int
    tasks: Tasks
    kills: list[dict[str, Any]]
    workers_started: int
    stopped_hard: list[str]
    poll: dict[str, int]
    poll_errors: list[str]
    poll_slowest_s: float
    drain_s: float
    dead_deleted: dict[str, Any]
    start: dict[str, int]
    baseline: dict[str, int]
    end: dict[str, int]
    start_patterns: list[str]
    groups: list[Group]
    spans: dict[str, int]
    memory_slack: int
    logdir: str
    memory_stats: dict[str, Any] = field(default_factory=dict)
    tool_writes: dict[str, list[str]] = field(default_factory=dict)  # by the tools' reads

    @property
    def kept_memory(self) -> int:
        return sum(g.memory for g in self.groups if g.verdict == "kept")

    @property
    def residual(self) -> int:
        """Memory the server holds at the end beyond its start once the keys, the slow log,
        the script and function caches and the per-command statistics are freed: what no
        part of its state explains."""
        start = self.start["used_memory"] - self.start["mem_clients_normal"]
        return int(self.memory_stats["decompose"]["left"]) - start

    @property
    def leaks(self) -> list[Group]:
        return [g for g in self.groups if g.verdict == "LEAK"]

    @property
    def ok(self) -> bool:
        return (not self.tasks.lost and not self.tasks.waiting and not self.leaks
                and not self.tasks.failed_unplanned
                and self.residual <= self.memory_slack and not self.written_by_reads)

    @property
    def written_by_reads(self) -> int:
        return sum(len(v) for v in self.tool_writes.values())

    def to_json(self) -> dict[str, Any]:
        t = self.tasks
        return {
            "ok": self.ok, "minutes": self.minutes, "rate": self.rate, "workers": self.workers,
            "tasks": {"sent": t.sent, "ends": dict(t.by_end), "lost": t.lost,
                      "failed_unplanned": t.failed_unplanned,
                      "waiting": t.waiting, "runs": t.runs, "planned_runs": t.planned_runs,
                      "ran_twice": t.ran_twice,
                      "dead_letters": t.dead_letters},
            "kills": self.kills, "workers_started": self.workers_started,
            "stopped_hard": self.stopped_hard, "poll": self.poll,
            "poll_errors": self.poll_errors, "poll_slowest_s": self.poll_slowest_s,
            "drain_s": self.drain_s, "dead_deleted": self.dead_deleted, "start": self.start,
            "baseline": self.baseline, "end": self.end, "start_patterns": self.start_patterns,
            "kept_memory": self.kept_memory, "residual": self.residual,
            "groups": [g.to_json() for g in self.groups], "spans": self.spans,
            "logdir": self.logdir, "memory_stats": self.memory_stats,
            "tool_writes": self.tool_writes,
        }


def render(o: Outcome) -> str:
    t = o.tasks
    kinds = Counter(k["what"] for k in o.kills)
    lines = [
        f"soak: {o.minutes:g} min, {o.rate:g} tasks/s per framework, {o.workers} workers "
        f"per framework (Celery, RQ, Dramatiq on belayq), tracing on; logs in {o.logdir}",
        "",
        f"sent {t.sent}; at their end {sum(t.by_end.values())} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(t.by_end.items()))}); "
        f"LOST {len(t.lost)}; failed but meant to succeed {len(t.failed_unplanned)}; "
        f"not drained {len(t.waiting)}",
        f"runs {t.runs} ({t.planned_runs} planned: retries and poison runs included; "
        f"{t.runs - t.planned_runs:+} from redeliveries after kills); completed more than "
        f"once {t.ran_twice}; dead letters at the end "
        f"{t.dead_letters} (deleted through the dashboard: {o.dead_deleted})",
        f"kill -9: {len(o.kills)} ({', '.join(f'{k} {v}' for k, v in kinds.items())}); "
        f"worker processes started {o.workers_started}; drain {o.drain_s:.0f} s; "
        f"stopped with SIGKILL after SIGTERM: {len(o.stopped_hard)}",
        f"polls: {o.poll['rounds']} rounds, dashboard {o.poll['dashboard']} answers, "
        f"exporter {o.poll['exporter']}, errors {o.poll['errors']}, slowest "
        f"{o.poll_slowest_s:.2f} s",
        f"keys the dashboard's and exporter's reads wrote with the fleet stopped (3 rounds): "
        f"{o.written_by_reads} {_examples(o.tool_writes)}",
        f"spans ended (tracing on): {sum(o.spans.values())} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(_by_framework(o.spans).items()))})",
        "",
        "| | DBSIZE | used_memory | clients | script cache |",
        "|---|---|---|---|---|",
    ]
    for label, m in (("start (empty)", o.start), ("fleet up, before traffic", o.baseline),
                     ("end (drained, fleet stopped)", o.end)):
        lines.append(f"| {label} | {m['dbsize']} | {m['used_memory']:,} | "
                     f"{m['mem_clients_normal']:,} | {m['used_memory_scripts']:,} |")
    parts = o.memory_stats["decompose"]
    kept = [k for g in o.groups if g.verdict == "kept" for k in g.keys]
    leaking = sum(g.memory for g in o.leaks)
    lines += [
        "",
        f"used_memory at the end beyond the start: "
        f"{o.end['used_memory'] - o.start['used_memory']:+,} B. Freed in turn at the end "
        "(clients' buffers aside): "
        + ", ".join(f"{k} {v:,} B" for k, v in parts.items() if k != "left")
        + f" (the keys' MEMORY USAGE: kept {o.kept_memory:,} B, leaking {leaking:,} B); "
        f"left beyond the start: {o.residual:+,} B (allowed {o.memory_slack:,} B)",
        "",
        f"keys at the end: {o.end['dbsize']}: kept {len(kept)} (of which "
        f"{sum(k.pttl > 0 for k in kept)} expire on their own), LEAK "
        f"{sum(len(g.keys) for g in o.leaks)}",
        "",
        "| keys left, by pattern | keys | elements | memory B | max TTL s | verdict | cap / why |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in o.groups:
        j = g.to_json()
        shown = repr(g.pattern)[1:-1]  # kombu's separators as escapes
        if g.verdict == "LEAK" and j["members"]:  # which records a leaking hash or set holds
            shown += "` holding `" + ", ".join(f"{repr(m)[1:-1]} x{n}"
                                              for m, n in j["members"].items())
        lines.append(f"| `{shown}` | {j['keys']} | {j['elements']} | "
                     f"{j['memory']:,} | {j['max_ttl_s']} | {g.verdict} | "
                     f"{g.cap}{'; ' if g.cap and g.why else ''}{g.why} |")
    if o.poll_errors:
        lines += ["", "poll errors (first):", *o.poll_errors[:5]]
    if t.lost:
        lines += ["", f"lost: {t.lost[:50]}"]
    if t.failed_unplanned:
        lines += ["", f"failed but meant to succeed (see the worker's log): "
                      f"{t.failed_unplanned[:50]}"]
    lines += ["", "RESULT: " + ("ok" if o.ok else "FAILED: " + "; ".join(_why(o)))]
    return "\n".join(lines)


def _examples(writes: dict[str, list[str]]) -> str:
    return "; ".join(f"{what}: {keys[:5]}" for what, keys in writes.items() if keys)


def _by_framework(spans: dict[str, int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for name, n in spans.items():
        out[name.split(" ", 1)[0]] += n
    return dict(out)


def _why(o: Outcome) -> list[str]:
    out = []
    if o.tasks.lost:
        out.append(f"{len(o.tasks.lost)} lost")
    if o.tasks.failed_unplanned:
        out.append(f"{len(o.tasks.failed_unplanned)} failed but meant to succeed")
    if o.tasks.waiting:
        out.append(f"{len(o.tasks.waiting)} not drained")
    if o.leaks:
        out.append(f"{len(o.leaks)} leaking key patterns")
    if o.written_by_reads:
        out.append(f"{o.written_by_reads} keys written by the tools' reads")
    if o.residual > o.memory_slack:
        out.append(f"memory residual {o.residual:,} B over {o.memory_slack:,} B")
    return out
