"""A hot queue sharded across cluster slots: consume+ack throughput with shards=1 and more,
in one run, on a local 3-master cluster and on one redis-server.

Run from the repository root::

    uv run python -m benchmarks.core.shards [--n 20000] [--consumers 4] [--count 10]
        [--shards 1 3 6] [--reps 1] [--json out.json]

For each setup (``cluster``: a 3-master ``RedisClusterServers``; ``single``: one
``RedisServer``) and each shard count, a fresh :class:`~belayq.ShardedQueue` is filled with
``--n`` messages (outside the timing), then ``--consumers`` consumer processes, started and
connected beforehand, are let go at once; each claims ``--count`` at a time and acks them
(``ack_many``) until a claim waits 0.5 s for nothing. Throughput is ``n`` over the time from
the start signal to the last ack. Every message must be acked once (the queue's counters are
checked), or the run fails.

Printed per run: msg/s, the ratio to shards=1 of the same setup, the server CPU each node
spent (``INFO cpu`` used_cpu_sys + used_cpu_user deltas: it shows the load spreading over
the nodes) and the consumers' own CPU. On a machine with few cores the consumers' Python is
the ceiling long before one Redis node is: the cluster ratio then says little about scaling,
and mostly that sharding costs nothing; the per-node CPU says where the server work went.
The single-server rows show that shards are not slower on one node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from belayq import ShardedQueue
from belayq.embedded import RedisClusterServers, RedisServer

ROOT = Path(__file__).resolve().parents[2]


def connect(setup: str, port: int) -> Any:
    if setup == "cluster":
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port)])
    return redis.Redis(port=port)


def child_main(argv: list[str]) -> None:
    """One consumer: connect, say READY, wait for GO, claim+ack until idle, report."""
    setup, port, name, shards, count = argv[0], int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    q = ShardedQueue(connect(setup, port), name, shards=shards)
    print("READY", flush=True)
    sys.stdin.readline()
    acked, last = 0, time.time()
    cpu0 = time.process_time()
    while got := q.claim(timeout=0.5, count=count):
        if not all(q.ack_many(got)):
            raise RuntimeError("an ack was refused")
        acked += len(got)
        last = time.time()
    q.close()
    print(
        json.dumps({"acked": acked, "last": last, "cpu_s": time.process_time() - cpu0}), flush=True
    )


def server_cpu(ports: list[int]) -> list[float]:
    out = []
    for port in ports:
        with redis.Redis(port=port) as c:
            info = c.info("cpu")
            out.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
    return out


def run_one(setup: str, ports: list[int], shards: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    client = connect(setup, ports[0])
    q = ShardedQueue(client, name, shards=shards, keeper=False)
    payload = b"x" * args.payload_bytes
    for start in range(0, args.n, 1000):
        q.publish_many([payload] * min(1000, args.n - start), batch=100)
    cmd = [sys.executable, "-m", "benchmarks.core.shards", "--child", setup, str(ports[0]), name,
           str(shards), str(args.count)]  # fmt: skip
    children = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd=ROOT) for _ in range(args.consumers)]  # fmt: skip
    try:
        for c in children:
            assert c.stdout is not None
            if c.stdout.readline().strip() != "READY":
                raise RuntimeError("a consumer did not start")
        cpu_before = server_cpu(ports)
        t0 = time.time()
        for c in children:
            assert c.stdin is not None
            c.stdin.write("GO\n")
            c.stdin.flush()
        reports = []
        for c in children:
            assert c.stdout is not None
            reports.append(json.loads(c.stdout.readline()))
            c.wait(30)
        cpu_after = server_cpu(ports)
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    stats = q.stats()
    acked = sum(r["acked"] for r in reports)
    if acked != args.n or stats["acked"] != args.n or stats["ready"] or stats["in_flight"]:
        raise RuntimeError(f"not every message acked once: {acked} reported, stats {stats}")
    q.drop()
    client.close()
    elapsed = max(r["last"] for r in reports) - t0
    return {
        "setup": setup, "shards": shards, "n": args.n, "elapsed_s": elapsed,
        "msg_per_s": args.n / elapsed,
        "server_cpu_s": [round(a - b, 3) for a, b in zip(cpu_after, cpu_before, strict=True)],
        "consumer_cpu_s": round(sum(r["cpu_s"] for r in reports), 3),
    }  # fmt: skip


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"consume+ack of one hot queue: n={args.n}, {args.consumers} consumer processes, "
        f"claim count={args.count}, payload {args.payload_bytes} B, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}",
        f"{'setup':8} {'shards':>6} {'msg/s':>9} {'x shards=1':>10}  server CPU s per node"
        "        consumers' CPU s",
    ]
    base: dict[str, float] = {}
    for row in rows:
        setup = row["setup"]
        rate = row["msg_per_s"]
        if row["shards"] == 1:
            base[setup] = rate
        ratio = f"{rate / base[setup]:.2f}" if setup in base else "-"
        cpu = " ".join(f"{c:5.2f}" for c in row["server_cpu_s"])
        lines.append(f"{setup:8} {row['shards']:>6} {rate:>9.0f} {ratio:>10}  {cpu:27}"
                     f"{row['consumer_cpu_s']:>8.2f}")  # fmt: skip
    return "\n".join(lines)


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(rows, key=lambda r: r["msg_per_s"])[len(rows) // 2]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child_main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.core.shards",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    ap.add_argument("--n", type=int, default=20000, help="messages per run")
    ap.add_argument("--consumers", type=int, default=4, help="consumer processes")
    ap.add_argument("--count", type=int, default=10, help="claim(count=...) of each consumer")
    ap.add_argument(
        "--shards",
        type=int,
        nargs="+",
        default=[1, 3, 6],
        help="shard counts on the cluster (1 first: the ratios' base)",
    )
    ap.add_argument(
        "--single-shards",
        type=int,
        nargs="+",
        default=[1, 3],
        help="shard counts on one redis-server",
    )
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--reps", type=int, default=1, help="runs of each; the median is shown")
    ap.add_argument("--json", type=Path, help="write every run's numbers here")
    args = ap.parse_args(argv)
    every: list[dict[str, Any]] = []
    plan: list[tuple[str, list[int]]] = [("cluster", args.shards), ("single", args.single_shards)]
    with RedisClusterServers() as cluster, RedisServer() as single:
        ports = {"cluster": [n.port for n in cluster.nodes], "single": [single.port]}
        if 6379 in ports["cluster"] + ports["single"]:
            raise RuntimeError("refusing to benchmark on port 6379")
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rep in range(args.reps):  # reps interleaved: neighbours in time are compared
            for setup, counts in plan:
                for shards in counts:
                    print(f"rep {rep + 1}/{args.reps}: {setup} shards={shards}",
                          file=sys.stderr, flush=True)  # fmt: skip
                    row = run_one(setup, ports[setup], shards, args)
                    runs.setdefault((setup, shards), []).append(row)
                    every.append(row)
        rows = [median_row(r) for r in runs.values()]
    print(report(rows, args))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "runs": every}, indent=2))  # fmt: skip
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
