"""Does the lease keeper thread keep a lease alive while the main thread is busy?

Run from the repository root::

    .venv/bin/python -m benchmarks.keeper_gil [--lease-ms 1000] [--factor 3] [--json out.json]

The main thread claims one message (``lease_ms`` 1000 by default, so the keeper extends it
every 333 ms) and then, for ``factor`` x the lease, does one of:

* ``sleep``: ``time.sleep`` (control; releases the GIL);
* ``python loop``: a pure-Python CPU-bound loop (the interpreter offers the GIL to other
  threads every ``sys.getswitchinterval()``);
* four single C calls that hold the GIL for their whole run: a catastrophically
  backtracking ``re.match``, ``sorted()`` of a big list of ints, ``sum(range(n))`` (looks
  like Python, but is one C call with an int fast path) and a big-int power ``3 ** e``.

Each C call is calibrated on this machine to last about ``factor`` x the lease.

Instruments: the keeper's heartbeats are timestamped (a ``ReliableQueue`` subclass wraps
``heartbeat``; a logging handler catches its "lease ... was lost" warnings),
``KEEPER.ticks`` is read before and after, and a separate *sweeper process* (not subject
to this process's GIL) plays the rest of the fleet: every 50 ms it samples how much of
the lease is left on the server's clock and runs ``sweep()``, which puts an expired lease
back on the queue. The lease survived when that sweeper never reclaimed it and ``ack``
returns True. A last run repeats the ``re`` case with the sweeper only watching (no
sweeping) to show that an expired lease nobody sweeps still acks True.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import logging
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.keeper import KEEPER
from benchmarks.stats import table

ROOT = Path(__file__).resolve().parent.parent
SWEEP_PERIOD_S = 0.05


class InstrumentedQueue(ReliableQueue):
    """Records when the keeper heartbeats."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.beats: list[float] = []

    def heartbeat(self) -> None:
        self.beats.append(time.monotonic())
        super().heartbeat()


class LostLeases(logging.Handler):
    """Counts the keeper's "lease of ... was lost" warnings (an extension it was refused)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "was lost" in record.getMessage():
            self.times.append(time.monotonic())


LOST = LostLeases()
logging.getLogger("belayq").addHandler(LOST)


# -- the sweeper process -----------------------------------------------------------------


def _sweeper_main(argv: list[str]) -> None:
    """Every 50 ms: sample the lease left (server clock) and, unless paused, sweep."""
    port, name, out_path, pause_path = int(argv[0]), argv[1], argv[2], argv[3]
    r = redis.Redis(host="127.0.0.1", port=port)
    q = ReliableQueue(r, name, keeper=False)
    with open(out_path, "a", buffering=1) as out:
        while True:
            t = time.monotonic()
            first = r.zrange(q.keys.leases, 0, 0, withscores=True)
            s, us = r.time()
            now_ms = s * 1000 + us / 1000
            rec: dict[str, Any] = {"t": t}
            if first:
                rec["left_ms"] = first[0][1] - now_ms
            if not os.path.exists(pause_path):
                res = q.sweep()
                if res.reclaimed:
                    rec["reclaimed"] = res.reclaimed
            out.write(json.dumps(rec) + "\n")
            time.sleep(max(0.0, t + SWEEP_PERIOD_S - time.monotonic()))


def _read_sweeper(path: str, t0: float, t1: float) -> tuple[float | None, float | None, int]:
    """Min lease left, time of the first reclaim (s after t0), samples, in [t0, t1]."""
    left: list[float] = []
    reclaim_at = None
    n = 0
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if not t0 <= rec["t"] <= t1:
                continue
            n += 1
            if "left_ms" in rec:
                left.append(rec["left_ms"])
            if rec.get("reclaimed") and reclaim_at is None:
                reclaim_at = rec["t"] - t0
    return (min(left) if left else None), reclaim_at, n


# -- the workloads -----------------------------------------------------------------------

_BACKTRACK = re.compile(r"(a+)+$")


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def calibrate(target_s: float) -> dict[str, Callable[[], object]]:
    """Workloads that each take about ``target_s`` on this machine."""
    work: dict[str, Callable[[], object]] = {}

    def sleep() -> None:
        time.sleep(target_s)

    def python_loop() -> int:
        end = time.perf_counter() + target_s
        x = 0
        while time.perf_counter() < end:
            x += 1
        return x

    work["sleep (control)"] = sleep
    work["pure-Python loop"] = python_loop

    # re: each extra 'a' doubles the backtracking
    k = 18
    while (t := _timed(functools.partial(_BACKTRACK.match, "a" * k + "b"))) < 0.25:
        k += 1
    k_target = k + max(0, round(math.log2(target_s / t)))
    text = "a" * k_target + "b"
    work[f"re.match((a+)+$, 'a'*{k_target}+'b')"] = lambda: _BACKTRACK.match(text)

    # sorted(): n log n on ints compared in C
    n = 1_000_000
    t = _timed(lambda: sorted(_ints(n)))
    n_sort = int(n * (target_s / t) ** (1 / 1.08))
    data = _ints(n_sort)
    work[f"sorted(list of {n_sort / 1e6:.1f}M ints)"] = lambda: sorted(data)

    # sum(range(n)): one C call
    n = 20_000_000
    t = _timed(lambda: sum(range(n)))
    n_sum = int(n * target_s / t)
    work[f"sum(range({n_sum / 1e6:.0f}M))"] = lambda: sum(range(n_sum))

    # big-int power: Karatsuba, about e**1.58
    e = 2_000_000
    t = _timed(lambda: 3**e)
    e_pow = int(e * (target_s / t) ** (1 / 1.58))
    work[f"3 ** {e_pow / 1e6:.1f}e6"] = lambda: 3**e_pow
    return work


def _ints(n: int) -> list[int]:
    return [(i * 2654435761) % 4294967291 for i in range(n)]


# -- one case ----------------------------------------------------------------------------


@dataclass
class Case:
    """One busy main thread while a lease is held."""

    work: str
    sweeper: str
    work_s: float
    heartbeats_during: int
    max_heartbeat_gap_ms: float
    keeper_ticks_during: int
    min_lease_left_ms: float | None
    reclaimed_after_s: float | None
    extend_refused: int
    ack: bool
    verdict: str
    gaps_ms: list[float] = field(default_factory=list)


def run_case(q: InstrumentedQueue, label: str, fn: Callable[[], object], sweep_log: str,
             sweeping: bool) -> Case:
    q.purge()
    q.publish(b"hold-me")
    (d,) = q.claim(timeout=1)
    time.sleep(0.5)  # a couple of ordinary heartbeats first
    beats0 = len(q.beats)
    lost0 = len(LOST.times)
    ticks0 = KEEPER.ticks
    t0 = time.monotonic()
    fn()
    t1 = time.monotonic()
    ticks1 = KEEPER.ticks
    time.sleep(0.4)  # let the keeper run once more after the work
    ack = q.ack(d)
    t2 = time.monotonic()
    beats = q.beats[max(0, beats0 - 1):]
    window = [b for b in beats if b <= t1] + [b for b in beats if b > t1][:1]
    gaps = [1000 * (b - a) for a, b in itertools.pairwise(window)]
    during = sum(t0 <= b <= t1 for b in beats)
    refused = len(LOST.times) - lost0
    left, reclaimed_at, _ = _read_sweeper(sweep_log, t0, t2)
    if ack and reclaimed_at is None:
        verdict = "lease kept"
        if left is not None and left < 0:
            verdict = "lease EXPIRED unnoticed (nobody swept); ack still True"
    else:
        verdict = "LEASE LOST: swept back to the queue, ack refused"
    q.purge()
    return Case(
        work=label,
        sweeper="sweeping" if sweeping else "watching only",
        work_s=t1 - t0,
        heartbeats_during=during,
        max_heartbeat_gap_ms=max(gaps) if gaps else float("nan"),
        keeper_ticks_during=ticks1 - ticks0,
        min_lease_left_ms=left,
        reclaimed_after_s=reclaimed_at,
        extend_refused=refused,
        ack=ack,
        verdict=verdict,
        gaps_ms=[round(g, 1) for g in gaps],
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--sweeper"]:
        _sweeper_main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description="lease keeper vs a busy main thread")
    ap.add_argument("--lease-ms", type=int, default=1000)
    ap.add_argument("--factor", type=float, default=3.0, help="work length in leases")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    target_s = args.lease_ms / 1000 * args.factor

    print(f"calibrating workloads to ~{target_s:.1f} s ...", file=sys.stderr, flush=True)
    work = calibrate(target_s)
    tmp = Path(tempfile.mkdtemp(prefix="belayq-gil-"))
    sweep_log, pause = str(tmp / "sweeper.jsonl"), str(tmp / "pause")
    cases: list[Case] = []
    with RedisServer() as server:
        if server.port == 6379:
            raise RuntimeError("refusing to run on port 6379")
        r = redis.Redis(host="127.0.0.1", port=server.port)
        name = f"gil-{uuid.uuid4().hex[:8]}"
        q = InstrumentedQueue(r, name, lease_ms=args.lease_ms)
        sweeper = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.keeper_gil", "--sweeper", str(server.port),
             name, sweep_log, pause],
            cwd=ROOT,
        )
        try:
            time.sleep(1.0)
            for label, fn in work.items():
                print(f"running: {label}", file=sys.stderr, flush=True)
                cases.append(run_case(q, label, fn, sweep_log, sweeping=True))
            re_label = next(k for k in work if k.startswith("re.match"))
            Path(pause).touch()
            time.sleep(0.2)
            print(f"running: {re_label}, sweeper only watching", file=sys.stderr, flush=True)
            cases.append(run_case(q, re_label, work[re_label], sweep_log, sweeping=False))
        finally:
            sweeper.kill()
            sweeper.wait()
        q.close(release=False)
        redis_version = r.info("server")["redis_version"]

    heartbeat_ms = min(q.config.heartbeat_ms, q.config.sweep_interval_ms)
    print(
        f"keeper_gil: lease_ms={args.lease_ms}, keeper heartbeat every {heartbeat_ms} ms, "
        f"work ~{target_s:.1f} s ({args.factor:g} x lease), "
        f"sys.getswitchinterval()={sys.getswitchinterval() * 1000:.0f} ms, "
        f"sweeper process every {SWEEP_PERIOD_S * 1000:.0f} ms"
    )
    print(
        f"env: Python {platform.python_version()}, redis-server {redis_version}, "
        f"redis-py {redis.__version__}, CPUs {os.cpu_count()}, load avg {os.getloadavg()[0]:.2f}"
    )
    print()
    rows = []
    for c in cases:
        rows.append([
            c.work,
            c.sweeper,
            f"{c.work_s:.2f}",
            str(c.heartbeats_during),
            f"{c.max_heartbeat_gap_ms:.0f}",
            str(c.keeper_ticks_during),
            "-" if c.min_lease_left_ms is None else f"{c.min_lease_left_ms:.0f}",
            "-" if c.reclaimed_after_s is None else f"+{c.reclaimed_after_s:.2f} s",
            str(c.extend_refused),
            str(c.ack),
            c.verdict,
        ])
    print(table(
        ["main thread runs", "sweeper", "work s", "heartbeats during", "max heartbeat gap ms",
         "keeper ticks during", "min lease left ms", "swept back at", "keeper saw lease lost",
         "ack", "verdict"],
        rows,
    ))
    print()
    print("Findings:")
    for c in cases:
        if c.sweeper != "sweeping":
            continue
        kept = c.verdict == "lease kept"
        print(
            f"- {c.work}: the keeper's longest silence was {c.max_heartbeat_gap_ms:.0f} ms "
            f"over {c.work_s:.1f} s of work; "
            + ("the lease survived (ack True)." if kept else
               f"the lease expired and another process swept the message back "
               f"{c.reclaimed_after_s:.2f} s into the work; ack returned {c.ack}.")
        )
    last = cases[-1]
    print(
        f"- {last.work} again with the sweeper only watching: min lease left "
        f"{last.min_lease_left_ms:.0f} ms (negative = expired on the server), ack {last.ack}. "
        "An expired lease that no claim or sweep has looked at yet is still acked and even "
        "re-extended by the keeper afterwards; with other consumers claiming, it is redelivered."
    )
    if args.json:
        args.json.write_text(json.dumps(
            {"lease_ms": args.lease_ms, "heartbeat_ms": heartbeat_ms, "target_s": target_s,
             "cases": [asdict(c) for c in cases]}, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
