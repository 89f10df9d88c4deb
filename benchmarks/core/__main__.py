"""belayq core vs the raw redis-py floor, on one private redis-server, in one run.

Run from the repository root::

    .venv/bin/python -m benchmarks.core [--n 20000] [--reps 3] [--json out.json]

What it measures (medians over ``--reps``, with min-max):

* publish msg/s: ``ReliableQueue.publish`` one by one and ``publish_many`` in batches, vs
  ``LPUSH`` one by one and ``LPUSH`` pipelined in the same batches;
* claim+ack msg/s: ``claim(count=1)`` + ``ack`` and ``claim(count=100)`` + ``ack_many``, vs
  the raw floor ``BLMOVE`` + ``LREM`` (2 round trips per message), plus two reference
  floors: the same pair pipelined 100 at a time, and the baseline's smallest loop with a
  lease (Lua ``LMOVE``+``ZADD``, then ``MULTI LREM ZREM EXEC``);
* the server's CPU time per message of every loop (``INFO cpu`` user+sys delta: scripts,
  commands and socket I/O), against the raw floor of the same path in the same rep, and
  its breakdown (:mod:`.breakdown`): what the ACL checks, the reply memo, the recovery
  steps, the counters, the ten priority levels and the call's keys and arguments cost;
* round trips and commands per message for every loop: round trips and top-level
  commands counted client-side (a counting redis-py ``Connection``; a pipeline is one round
  trip), and every command the server ran (``INFO commandstats`` delta: it includes the
  commands run inside Lua and whatever the lease keeper thread sent);
* Redis bytes per message (``INFO memory used_memory`` delta): queued (belayq id mode vs
  raw ``LPUSH`` of the same payloads) and in flight (claimed, not acked);
* recovery after ``kill -9``: a child process claims a message (``lease_ms`` 2000 and
  5000), holds it for longer than its lease (its keeper extends it; a consumer watching
  the queue must not get it meanwhile), and is SIGKILLed; the time until another consumer
  receives it. The raw floor (a ``BLMOVE`` consumer killed mid-message) is watched for a
  while to show that it never comes back.

The server is started here (``belayq.embedded.RedisServer`` on a free port, never 6379)
and stopped at the end. The numbers are noisy on a shared 2-core box: client, server and
any other load share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from belayq.embedded import RedisServer
from belayq.keeper import KEEPER

from .breakdown import run_breakdown
from .counting import make_client
from .environment import environment
from .loops import run_throughput
from .memory import run_memory
from .recovery import child_main, crash_belayq, crash_raw
from .report import report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child_main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.core",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    ap.add_argument("--n", type=int, default=20000, help="messages per throughput loop")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every measurement")
    ap.add_argument("--batch", type=int, default=100, help="publish_many/claim count batch")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--leases", type=int, nargs="+", default=[2000, 5000],
                    help="lease_ms values of the kill -9 runs")
    ap.add_argument("--poll-s", type=float, default=0.25,
                    help="claim(timeout=...) of the watching consumer in the kill -9 runs")
    ap.add_argument("--crash-reps", type=int, default=None,
                    help="kill -9 runs per lease (default: --reps)")
    ap.add_argument("--raw-window", type=float, default=10.0,
                    help="seconds to watch the killed raw consumer's message")
    ap.add_argument("--blocked-reps", type=int, default=1,
                    help="kill -9 runs of each blocked-claim() variant (0 = skip them; "
                    "their timing is set by the sweep period and the BLMOVE cap)")
    ap.add_argument("--breakdown-n", type=int, default=5000,
                    help="messages per loop of the server-CPU breakdown (0 = skip it)")
    ap.add_argument("--only-cpu", action="store_true",
                    help="measure the throughput loops and the breakdown only (no memory, "
                    "no kill -9 runs)")
    ap.add_argument("--json", type=Path, help="write every rep's numbers here")
    args = ap.parse_args(argv)
    crash_reps = args.reps if args.crash_reps is None else args.crash_reps

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    t_start = time.monotonic()
    with RedisServer() as server:
        if server.port == 6379:
            raise RuntimeError("refusing to benchmark on port 6379")
        r = make_client(server.port)
        r.ping()
        res: dict[str, Any] = {
            "args": {
                "n": args.n, "reps": args.reps, "batch": args.batch,
                "payload_bytes": args.payload_bytes, "leases": args.leases,
                "poll_s": args.poll_s, "crash_reps": crash_reps,
                "raw_window_s": args.raw_window, "blocked_reps": args.blocked_reps,
            },
            "env": environment(r, server.port),
        }
        throughput: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.reps):
            progress(f"throughput rep {rep + 1}/{args.reps}")
            for name, sample in run_throughput(r, args.n, args.payload_bytes, args.batch).items():
                throughput.setdefault(name, []).append(asdict(sample))
        res["throughput"] = throughput

        breakdown: list[dict[str, dict[str, float]]] = []
        for rep in range(args.reps if args.breakdown_n else 0):
            progress(f"server CPU breakdown rep {rep + 1}/{args.reps}")
            breakdown.append(run_breakdown(r, args.breakdown_n, args.payload_bytes, args.batch))
        res["breakdown"] = breakdown
        if args.only_cpu:  # neither memory nor kill -9 runs
            mem_reps = crash_reps = blocked_reps = 0
        else:
            mem_reps, blocked_reps = args.reps, args.blocked_reps

        memory = []
        for rep in range(mem_reps):
            progress(f"memory rep {rep + 1}/{args.reps}")
            memory.append(run_memory(r, args.n, args.payload_bytes, args.batch))
        res["memory"] = memory

        recovery = []
        window = max(args.leases) / 1000 + 10
        runs = [(lease, "poll", crash_reps) for lease in args.leases]
        runs += [(min(args.leases), c, blocked_reps) for c in ("blocked", "blocked-nokeeper")]
        for rep in range(max(crash_reps, blocked_reps)):
            for lease, consumer, reps in runs:
                if rep >= reps:
                    continue
                progress(f"kill -9 rep {rep + 1}/{reps}, lease_ms={lease}, {consumer}")
                rec = crash_belayq(r, server.port, lease, consumer, args.poll_s, window)
                recovery.append(asdict(rec))
        if not args.only_cpu:
            progress(f"kill -9 of a raw BLMOVE consumer, watching {args.raw_window:.0f} s")
            recovery.append(asdict(crash_raw(r, server.port, args.poll_s, args.raw_window)))
        res["recovery"] = recovery
        res["loadavg_end"] = os.getloadavg()
        res["elapsed_s"] = time.monotonic() - t_start
        r.close()
    res["keeper_ticks"] = KEEPER.ticks
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
