"""Shared pieces of the fault-injection tests: run the killable child, replay its call log,
run a fresh surviving consumer, and check the contract on what they did together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from belayq import ConnectionLost, ReliableQueue

CHILD = Path(__file__).with_name("consumer_child.py")
# Generous slack on top of the contract's bound: a loaded 2-core machine, other test runs.
SLACK_S = 8.0


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def spawn_child(
    port: int,
    queue: str,
    scenario: str,
    log: Path,
    *,
    kill_at: int = 0,
    when: str = "before",
    lease_ms: int,
    sweep_ms: int,
    client_name: str,
    stop: bool = False,
) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, str(CHILD), "--port", str(port), "--queue", queue,
        "--scenario", scenario, "--kill-at", str(kill_at), "--when", when,
        "--lease-ms", str(lease_ms), "--sweep-ms", str(sweep_ms),
        "--client-name", client_name, "--log", str(log), *(["--stop"] if stop else []),
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )


@dataclass
class ChildRun:
    """What a child did, replayed from its call log (completed calls only)."""

    returncode: int
    stderr: str
    records: list[dict[str, Any]]
    killed_at: int | None = None
    killed_when: str | None = None
    kill_t: float | None = None
    calls: int | None = None  # set when the run reached its end
    held: dict[str, str] = field(default_factory=dict)  # leased, unsettled: id -> token
    blmoved: set[str] = field(default_factory=set)  # moved by BLMOVE, lease not registered
    acked: set[str] = field(default_factory=set)
    given_back: set[str] = field(default_factory=set)  # nacked or released (not dups later)
    net_leases: Counter[str] = field(default_factory=Counter)  # leases - releases
    stale: int = 0
    kill_cmd: str = ""

    @property
    def in_flight(self) -> set[str]:
        """Messages the child had taken out of ready and not settled when it died."""
        return set(self.held) | self.blmoved


def _groups(flat: list[Any]) -> list[tuple[str, str, str, int]]:
    return [(flat[i], flat[i + 1], flat[i + 2], int(flat[i + 3])) for i in range(0, len(flat), 5)]


def replay(returncode: int, stderr: str, log: Path) -> ChildRun:
    text = log.read_text() if log.exists() else ""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    run = ChildRun(returncode, stderr, records)

    def leased(groups: list[tuple[str, str, str, int]]) -> None:
        for mid, _payload, token, _n in groups:
            run.held[mid] = token
            run.net_leases[mid] += 1
            run.given_back.discard(mid)

    for rec in records:
        phase = rec["phase"]
        if phase == "kill":
            run.killed_at, run.killed_when, run.kill_t = rec["k"], rec["when"], rec["t"]
            run.kill_cmd = f"{rec['when']} #{rec['k']} {rec.get('script') or rec['cmd']}"
            continue
        if phase == "end":
            run.calls = rec["calls"]
            continue
        if phase != "done":
            continue
        reply = rec["reply"]
        if rec["cmd"] == "BLMOVE":
            if reply is not None:
                run.blmoved.add(reply)
            continue
        script = rec.get("script")
        argv = rec.get("argv", [])
        if script == "claim":
            leased(_groups(reply[1:]))
        elif script == "lease":
            run.blmoved.discard(argv[6])  # lease.lua ARGV[13], the entry
            leased(_groups(reply[2:]))
        elif script == "ack":
            step = 3 if argv[0] == "1" else 2  # ack.lua ARGV[7]: pairs, or triples with results
            for i, ok in enumerate(reply):
                mid = argv[1 + step * i]
                if ok == 1:
                    run.acked.add(mid)
                    run.held.pop(mid, None)
                else:
                    run.stale += 1
        elif script == "nack":
            if reply == "stale":
                run.stale += 1
            else:
                run.held.pop(argv[0], None)
                run.given_back.add(argv[0])
        elif script == "release":
            pairs = [argv[i] for i in range(0, len(argv), 2)]
            assert reply == len(pairs), f"release released {reply} of {len(pairs)}"
            for mid in pairs:
                run.held.pop(mid, None)
                run.net_leases[mid] -= 1
                run.given_back.add(mid)
    return run


def wait_child(proc: subprocess.Popen[str], log: Path, timeout: float = 60) -> ChildRun:
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        raise AssertionError(f"child did not finish within {timeout} s; stderr:\n{err}") from None
    return replay(proc.returncode, err, log)


@dataclass
class Survival:
    """What a fresh consumer got after the crash."""

    deliveries: list[tuple[str, int, float]]  # (id, deliveries, wall time of the claim)
    acked: set[str]
    stats: dict[str, int]
    seconds: float


def survive(
    port: int,
    queue: str,
    expected: set[str],
    already_acked: set[str],
    *,
    lease_ms: int,
    sweep_ms: int,
    deadline_s: float = 40.0,
) -> Survival:
    """Run a fresh consumer (plain claim/ack loop, its lease keeper on, as a worker's) until
    every expected message is acked and nothing is left anywhere in the queue's keys."""
    client = redis.Redis(port=port)
    q = ReliableQueue(client, queue, keeper=True, lease_ms=lease_ms, sweep_interval_ms=sweep_ms)
    got: list[tuple[str, int, float]] = []
    acked: set[str] = set()
    start = time.monotonic()
    stats: dict[str, int] = {}
    try:
        while time.monotonic() - start < deadline_s:
            if expected <= acked | already_acked:
                stats = q.stats()
                if not any(stats[k] for k in ("ready", "in_flight", "landing", "delayed")):
                    break
            try:
                batch = q.claim(timeout=0.2, count=4)
            except ConnectionLost:
                continue
            for d in batch:
                got.append((d.id, d.deliveries, time.time()))
                if q.ack(d):
                    acked.add(d.id)
        else:
            stats = q.stats()
    finally:
        q.close(release=False)
        client.close()
    return Survival(got, acked, stats, time.monotonic() - start)


def check_contract(
    published: set[str], child: ChildRun, surv: Survival, *, lease_ms: int, sweep_ms: int
) -> dict[str, Any]:
    """Assert no loss, acked exactly once, duplicates only for what the child held; return
    the measured recovery latencies of the child's in-flight messages."""
    where = f"child killed {child.kill_cmd or 'never'}"
    lost = published - child.acked - surv.acked
    assert not lost, f"{where}: messages never acked: {lost}; stats={surv.stats}"
    assert not child.acked & surv.acked, f"{where}: acked twice: {child.acked & surv.acked}"
    st = surv.stats
    leftovers = {k: st.get(k, 0) for k in ("ready", "in_flight", "landing", "delayed", "dead")}
    assert not any(leftovers.values()), f"{where}: left in the queue: {leftovers}"
    assert st.get("acked", 0) == len(published), f"{where}: acked counter {st.get('acked')}"
    assert st.get("stale_acks", 0) == child.stale, f"{where}: stale acks {st}"

    surv_ids = [mid for mid, _n, _t in surv.deliveries]
    assert len(surv_ids) == len(set(surv_ids)), f"{where}: survivor got a copy twice {surv_ids}"
    assert not set(surv_ids) & child.acked, f"{where}: redelivered after the child's ack"
    for mid, n, _t in surv.deliveries:
        # A message the child leased and did not give back may come again (it was in
        # flight); anything else the survivor gets must be fresh or given back.
        if child.net_leases[mid] and mid not in child.given_back:
            assert mid in child.held, f"{where}: {mid} redelivered but was not in flight"
        assert n == child.net_leases[mid] + 1, (
            f"{where}: {mid} delivered with deliveries={n}, expected "
            f"{child.net_leases[mid] + 1} (child's net leases + 1)"
        )
    latencies = {}
    first_seen = {}
    for mid, _n, t in surv.deliveries:
        first_seen.setdefault(mid, t)
    for mid in child.in_flight:
        assert mid in first_seen, f"{where}: in-flight {mid} never came back"
        assert child.kill_t is not None
        latencies[mid] = first_seen[mid] - child.kill_t
    # lease-less (BLMOVE-d) entries wait one sweep to be found, then a provisional lease
    # of lease_ms, then one more sweep; leased ones wait lease_ms + one sweep.
    bound = (lease_ms + 2 * sweep_ms) / 1000 + SLACK_S
    for mid, lat in latencies.items():
        assert lat < bound, f"{where}: {mid} came back after {lat:.2f} s (> {bound:.1f} s)"
    return {
        "kill": child.kill_cmd or "none",
        "in_flight": len(child.in_flight),
        "leased_in_flight": len(child.held),
        "blmoved_in_flight": len(child.blmoved),
        "dups": len(set(surv_ids) & set(child.held)),
        "latencies": sorted(latencies.values()),
    }


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def sigkill(proc: subprocess.Popen[str]) -> float:
    t = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    return t
