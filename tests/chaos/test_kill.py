"""kill -9 a consumer between every pair of Redis calls of the claim and settle paths.

The child (consumer_child.py) counts its Redis calls and SIGKILLs itself right before or
right after call K. A dry run gives the number of calls N of a scenario; then K = 1..N (in
both positions) are killed, and K = N + 1 must run to the end. After every kill a fresh
consumer must get every message the child did not ack, and the contract is checked:
nothing lost, every message acked exactly once (by the survivor, or by the child when its
ack reached Redis), copies only of what the child held in flight, deliveries counted, and
the in-flight messages back within lease + sweep periods (+ slack for a loaded machine).

Scenarios: ``script`` (messages waiting: claim.lua, extend, ack, nack, claim, release,
claim of 3, ack_many, sweep) and ``blmove`` (empty queue: claim.lua, BLMOVE, then a message
is published, lease.lua, extend, nack, claim.lua, ack). Kill points covered: before/after
each of those calls, which includes right after BLMOVE returned (the gap before lease.lua).
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq import ReliableQueue

from .harness import (
    SLACK_S,
    ChildRun,
    check_contract,
    new_name,
    sigkill,
    spawn_child,
    survive,
    wait_child,
)

LEASE_MS = 800
SWEEP_MS = 100
PARALLEL = 4

# The calls each scenario makes, in order. The dry run must make these (as a subsequence:
# the core may add calls; every call of the dry run is a kill point whatever it is).
EXPECTED_CALLS = {
    "script": ["claim", "extend", "ack", "nack", "claim", "release", "claim", "ack", "sweep"],
    "blmove": ["claim", "BLMOVE", "lease", "extend", "nack", "claim", "ack"],
}


def _wait_blocked(admin: redis.Redis, name: str, proc: Any, timeout: float = 20.0) -> bool:
    """Wait until the child is blocked in BLMOVE (True) or has exited (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        for c in admin.client_list():
            if c.get("name") == name and c.get("cmd") == "blmove" and "b" in c.get("flags", ""):
                return True
        time.sleep(0.01)
    raise AssertionError(f"child {name} neither blocked in BLMOVE nor exited in {timeout} s")


def run_trial(port: int, scenario: str, kill_at: int, when: str, tmp: Path) -> dict[str, Any]:
    admin = redis.Redis(port=port)
    queue = new_name(f"kill-{scenario}")
    name = new_name("child")
    producer = ReliableQueue(admin, queue, keeper=False, lease_ms=LEASE_MS,
                             sweep_interval_ms=SWEEP_MS)  # fmt: skip
    published: list[str] = []
    if scenario == "script":
        published = [producer.publish(f"m{i}") for i in range(4)]
    log = tmp / f"{queue}-{kill_at}-{when}.jsonl"
    proc = spawn_child(port, queue, scenario, log, kill_at=kill_at, when=when,
                       lease_ms=LEASE_MS, sweep_ms=SWEEP_MS, client_name=name)  # fmt: skip
    if scenario == "blmove":
        _wait_blocked(admin, name, proc)
        published.append(producer.publish("late"))
    child = wait_child(proc, log)
    admin.close()
    if child.returncode == 0:
        assert child.calls is not None and child.killed_at is None
        result: dict[str, Any] = {"completed": True, "calls": child.calls}
    else:
        assert child.returncode == -9, f"child failed (rc {child.returncode}):\n{child.stderr}"
        assert child.killed_at == kill_at and child.killed_when == when
        result = {"completed": False}
    surv = survive(port, queue, set(published), child.acked, lease_ms=LEASE_MS,
                   sweep_ms=SWEEP_MS)  # fmt: skip
    result.update(check_contract(set(published), child, surv, lease_ms=LEASE_MS,
                                 sweep_ms=SWEEP_MS))  # fmt: skip
    result["child"] = child
    return result


def _dry_run(port: int, scenario: str, tmp: Path) -> ChildRun:
    res = run_trial(port, scenario, 0, "before", tmp)
    assert res["completed"], "the dry run (no kill) must complete"
    child: ChildRun = res["child"]
    done = calls_of(child)
    rest = iter(done)
    assert all(name in rest for name in EXPECTED_CALLS[scenario]), done
    return child


def calls_of(child: ChildRun) -> list[str]:
    return [r.get("script") or r["cmd"] for r in child.records if r["phase"] == "done"]


@pytest.mark.parametrize("scenario", ["script", "blmove"])
def test_kill9_between_every_pair_of_redis_calls(redis_server, tmp_path, scenario):
    port = redis_server.port
    dry = _dry_run(port, scenario, tmp_path)
    n = dry.calls
    assert n == len(calls_of(dry))
    points = [(k, w) for k in range(1, n + 2) for w in ("before", "after")]
    points.remove((n + 1, "after"))
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {p: pool.submit(run_trial, port, scenario, p[0], p[1], tmp_path) for p in points}
        results = {p: f.result() for p, f in futures.items()}

    # K = 1..N are killed; K = N + 1 runs to the end without reaching K.
    for (k, _w), res in results.items():
        assert res["completed"] is (k == n + 1), (k, res)

    print(f"\n[{scenario}] {n} Redis calls ({' '.join(calls_of(dry))}), {len(points)} runs "
          f"({len(points) - 1} killed), lease {LEASE_MS} ms, sweep {SWEEP_MS} ms")  # fmt: skip
    all_lat = []
    for (k, w), res in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1] == "after")):
        lats = ", ".join(f"{x:.2f}s" for x in res["latencies"]) or "-"
        all_lat += res["latencies"]
        print(f"  K={k:<2} {w:<6} {res['kill']:<22} in flight {res['in_flight']} "
              f"(leased {res['leased_in_flight']}, lease-less {res['blmoved_in_flight']}) "
              f"copies {res['dups']}  back after: {lats}")  # fmt: skip
    if all_lat:
        print(f"  recovery latency: min {min(all_lat):.2f}s max {max(all_lat):.2f}s "
              f"(bound lease+2*sweep = {(LEASE_MS + 2 * SWEEP_MS) / 1000:.2f}s "
              f"+ slack {SLACK_S:.0f}s)")  # fmt: skip

    # The interesting points were really hit: something was in flight at some kill, and
    # for blmove the gap between BLMOVE and lease.lua was hit with a lease-less entry.
    assert any(res["leased_in_flight"] for res in results.values())
    if scenario == "blmove":
        k = calls_of(dry).index("BLMOVE") + 1
        for gap in (results[(k, "after")], results[(k + 1, "before")]):
            assert gap["blmoved_in_flight"] == 1 and gap["leased_in_flight"] == 0, gap


def test_seed_step3_kill9_worker_holding_a_job(redis_server, tmp_path):
    """Seed verification step 3: kill -9 a worker that holds a job; the sweeper (another
    live worker's lease keeper) puts it back in ready within one lease period plus one
    sweep period, and the redelivery shows deliveries == 2."""
    lease_ms, sweep_ms = 1000, 200
    port = redis_server.port
    admin = redis.Redis(port=port)
    queue = new_name("seed3")
    # Another live worker: its lease keeper runs the guarded sweep every period.
    other = ReliableQueue(admin, queue, keeper=True, lease_ms=lease_ms, sweep_interval_ms=sweep_ms)
    mid = other.publish(b"job")
    log = tmp_path / "hold.jsonl"
    proc = spawn_child(port, queue, "hold", log, lease_ms=lease_ms, sweep_ms=sweep_ms,
                       client_name=new_name("holder"))  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:2] == ["HOLDING", mid] and line[2] == "1", line
        # While the worker lives, its keeper extends the lease: nothing comes back.
        time.sleep(2.5 * lease_ms / 1000)
        st = other.stats()
        assert (st["ready"], st["leased"], st.get("reclaimed", 0)) == (0, 1, 0), st
        # The other worker is idle (nothing to claim) but its keeper sweeps from now on.
        assert other.claim(timeout=0) == []
        t_kill = sigkill(proc)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = t_kill + 30
    while admin.lpos(other.keys.ready, mid) is None:
        assert time.time() < deadline, f"job not back in ready 30 s after kill: {other.stats()}"
        time.sleep(0.005)
    back = time.time() - t_kill
    bound = (lease_ms + sweep_ms) / 1000
    print(f"\n[seed step 3] job back in ready {back:.3f} s after kill -9 "
          f"(lease {lease_ms} ms + sweep {sweep_ms} ms = {bound:.1f} s)")  # fmt: skip
    assert back < bound + SLACK_S
    [d] = other.claim(timeout=5)
    assert (d.id, d.payload, d.deliveries) == (mid, b"job", 2)
    assert other.ack(d)
    st = other.stats()
    assert (st["ready"], st["in_flight"], st["leased"], st["reclaimed"]) == (0, 0, 0, 1), st
    other.close(release=False)
    admin.close()


def test_fresh_idle_worker_adopts_lease_less_entry(redis_server, make_queue, r):
    """Regression (was BUG-1, fixed in b35fcfc): a claimer killed right after BLMOVE leaves
    a lease-less entry in processing. Only sweep.lua adopts such entries (claim.lua sweeps
    expired leases only), and the keeper used to start sweeping a queue only after a
    successful claim, so a fresh worker that only calls claim() -- the whole fleet after a
    restart, say -- never got the message back: stranded in processing. Now claim()
    registers with the keeper on its first call."""
    lease_ms, sweep_ms = 300, 50
    dead = make_queue(r, lease_ms=lease_ms, sweep_interval_ms=sweep_ms)
    mid = dead.publish(b"x")
    assert r.execute_command(*dead.blmove_command(1)) == mid.encode()  # ... then kill -9
    fresh = make_queue(redis.Redis(port=redis_server.port), keeper=True, lease_ms=lease_ms,
                       sweep_interval_ms=sweep_ms)  # fmt: skip
    got = []
    end = time.monotonic() + (lease_ms + 2 * sweep_ms) / 1000 + 3
    while not got and time.monotonic() < end:
        got = fresh.claim(timeout=0.5)
    assert got, f"lease-less entry stranded in processing; stats {fresh.stats()}"
    assert got[0].id == mid and got[0].deliveries == 1


def _wait_stopped(pid: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.005)
    raise AssertionError(f"child {pid} did not stop within {timeout} s")


@pytest.mark.parametrize("resume", ["in_time", "too_late_held", "too_late_acked"])
def test_claimer_stalled_between_blmove_and_lease(redis_server, tmp_path, resume):
    """The BLMOVE -> lease.lua gap with a claimer that stalls (SIGSTOP) instead of dying.
    The sweep gives the lease-less entry a provisional lease. Resumed in time, the claimer's
    lease.lua takes it over (deliveries 1, no copy); resumed after the provisional lease
    expired, the entry went back to ready and another worker got it, and the late claimer
    is told it lost the claim: it must not get (or run) the message."""
    lease_ms, sweep_ms = 1500, 100
    port = redis_server.port
    admin = redis.Redis(port=port)
    queue = new_name("stall")
    name = new_name("staller")
    q = ReliableQueue(admin, queue, keeper=False, lease_ms=lease_ms, sweep_interval_ms=sweep_ms)
    log = tmp_path / "stall.jsonl"
    proc = spawn_child(port, queue, "stall", log, kill_at=2, when="after", lease_ms=lease_ms,
                       sweep_ms=sweep_ms, client_name=name, stop=True)  # fmt: skip
    try:
        assert _wait_blocked(admin, name, proc)
        mid = q.publish(b"stalled")
        _wait_stopped(proc.pid)  # right after BLMOVE returned, before lease.lua
        assert admin.lpos(q.keys.processing, mid) is not None
        assert admin.zscore(q.keys.leases, mid) is None
        assert q.sweep().orphans_found == 1  # provisional lease (token '0')
        other = None
        if resume != "in_time":
            # Another worker; its keeper's sweep puts the entry back once the provisional
            # lease expired, and its blocked claim gets it.
            other = ReliableQueue(redis.Redis(port=port), queue, keeper=True,
                                  lease_ms=lease_ms, sweep_interval_ms=sweep_ms)  # fmt: skip
            [d] = other.claim(timeout=lease_ms / 1000 + SLACK_S)
            assert (d.id, d.deliveries) == (mid, 1)
            if resume == "too_late_acked":
                assert other.ack(d)
        proc.send_signal(signal.SIGCONT)
        child = wait_child(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert child.returncode == 0, child.stderr
    lease_reply = next(r["reply"] for r in child.records if r.get("script") == "lease")
    st = q.stats()
    print(f"\n[stall {resume}] lease.lua reply {lease_reply}; stats {st}")
    if resume == "in_time":
        assert lease_reply[1] == 0 and lease_reply[2] == mid and lease_reply[5] == 1
        assert child.acked == {mid}
        assert st.get("adopted", 0) == 0
    else:
        assert lease_reply[1] == 1 and len(lease_reply) == 2, "late claimer must lose the claim"
        assert child.acked == set() and not child.held
        assert st["adopted"] == 1
        if resume == "too_late_held":
            assert other is not None and other.ack(d)
            st = q.stats()
        if other is not None:
            other.close(release=False)
            other.client.close()
    assert (st["ready"], st["in_flight"], st["leased"], st["delayed"], st["dead"]) == (0,) * 5
    assert st["acked"] == 1 and st.get("stale_acks", 0) == 0
    admin.close()
