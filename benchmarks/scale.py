"""How belayq's costs grow with the messages held in flight, beside stock kombu, in one run.

Run from the repository root::

    uv run python -m benchmarks.scale [--held 0,1000,10000,100000] [--ops 3000] [--reps 1]
    uv run python -m benchmarks.scale --quick          # held 0,1000,10000, fewer ops (~1 min)

For every held count N (``--held``) and two belayq modes:

* ``ids``: ``ReliableQueue(client, name, lease_ms=3_600_000, keeper=False)``, 100-byte
  payloads (the list holds ids, the payload sits in the queue's payloads hash);
* ``envelopes``: ``ReliableQueue(client, name, ready_key="bench-kq-<uuid>",
  payload_in_list=True, lease_ms=3_600_000, keeper=False)``, distinct ~1 KB kombu JSON
  envelopes of Celery protocol-2 messages (what ``belayq://`` runs on);

it measures, with N claims held (published with ``publish_many`` and claimed by a second
queue object, ``claim(timeout=0, count=1000)``, never acked):

1. claim+ack msg/s: ``--ops`` extra messages, ``d = q.claim(timeout=0, count=1)[0];
   q.ack(d)`` one by one (and the server time of those scripts per message);
2. full sweep: ``q.sweep()`` ``--sweeps`` times; the median SERVER time of the sweep
   script, from ``INFO commandstats`` deltas (``cmdstat_evalsha``/``cmdstat_fcall`` usec over
   calls, taken around each single sweep; nothing else runs scripts meanwhile), and the
   client wall time;
3. reclaim: 1,000 extra messages claimed by a ``lease_ms=200`` queue object, left to
   expire, then ONE ``q.sweep()`` (server time as above), checking ``reclaimed == 1000``;
   done ``--reclaims`` times per rep (median);
4. Redis bytes per message: ``INFO memory used_memory`` deltas while filling, per ready
   (published) message and per held (claimed) message.

Stock kombu (redis:// transport, same server, same N): N unacked messages are written in
kombu's exact format straight into its ``unacked`` hash (``json [payload, exchange,
routing_key]``) and ``unacked_index`` zset (score ``time()``), as ``QoS.append`` does (the
format is checked against one real ``basic_get(no_ack=False)`` first); then stock consume+ack
at prefetch 1 on the same kind of 1 KB envelopes, the way ``benchmarks/kombu_bench.py``
does it: ``kombu.Consumer(prefetch_count=1)``, ``message.ack()`` in the callback,
``conn.drain_events()``.

All three are filled for one N, then each rep runs ids, envelopes and stock in turn (so
the belayq/stock ratio compares neighbours in time); medians over ``--reps``. The server
is started here (``belayq.embedded.RedisServer`` on a free port, never 6379) and flushed
between held counts. Results go to ``benchmarks/results/scale.json``. Client and server
share the box's cores: compare ratios, and expect noise.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.sources import SCRIPT_COMMANDS
from benchmarks.core.environment import environment
from benchmarks.stats import med_or_none

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "scale.json"
LEASE_MS = 3_600_000
RECLAIM_N = 1000
MODES = ("ids", "envelopes")

# The targets of the scale issue: (key, text).
TARGETS = [
    ("claim_ack_ratio", "claim+ack at 100k held >= 0.8x the rate at 0 held (both modes)"),
    ("sweep_ms", "full sweep at 100k held <= 10 ms server time"),
    ("reclaim_ms", "reclaiming 1,000 expired leases <= 50 ms"),
    ("vs_stock", "at 100k held, belayq (envelopes) >= 1.0x stock kombu consume+ack"),
]


# -- payloads -----------------------------------------------------------------------------


def id_payloads(n: int, tag: str) -> list[bytes]:
    return [(f"{tag}-{i:08d}-".encode()).ljust(100, b"x")[:100] for i in range(n)]


def celery_message(i: int, queue: str) -> dict[str, Any]:
    """A Celery protocol-2 message as kombu's redis transport stores it (body base64)."""
    task_id = str(uuid.uuid4())
    args = [i, f"user-{i}@example.com", "Your weekly report is ready", {"locale": "en_GB"}]
    kwargs = {"template": "weekly_report", "priority": "normal", "tracking": True}
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    body = json.dumps([args, kwargs, embed]).encode()
    return {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": "proj.tasks.send_report_email", "id": task_id,
            "shadow": None, "eta": None, "expires": None, "group": None, "group_index": None,
            "retries": 0, "timelimit": [None, None], "root_id": task_id, "parent_id": None,
            "argsrepr": repr(args), "kwargsrepr": repr(kwargs),
            "origin": "gen4242@web-7f9c6d5b8-x2k4p", "ignore_result": False,
            "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
        },
        "properties": {
            "correlation_id": task_id, "reply_to": str(uuid.uuid4()), "delivery_mode": 2,
            "delivery_info": {"exchange": queue, "routing_key": queue}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    }


def envelopes(n: int, queue: str, start: int = 0) -> list[bytes]:
    from kombu.utils.json import dumps

    return [dumps(celery_message(start + i, queue)).encode() for i in range(n)]


# -- helpers ------------------------------------------------------------------------------


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise RuntimeError(f"benchmark invariant broken: {what}")


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def evalsha_stats(r: redis.Redis) -> tuple[int, int]:
    """Calls and server usec of belayq's transitions so far (EVALSHA and FCALL)."""
    info = r.info("commandstats")
    rows = [info.get(f"cmdstat_{c}", {}) for c in SCRIPT_COMMANDS]
    return sum(int(w.get("calls", 0)) for w in rows), sum(int(w.get("usec", 0)) for w in rows)


def server_usec(r: redis.Redis) -> int:
    """Server time of every top-level command so far (INFO itself excluded; for scripts
    use :func:`evalsha_stats`: commands run inside Lua are counted twice here)."""
    info = r.info("commandstats")
    return sum(int(v["usec"]) for k, v in info.items()
               if k.startswith("cmdstat_") and k != "cmdstat_info")


def timed_script(r: redis.Redis, fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """Run ``fn`` (one script call); (result, server ms from commandstats, wall ms)."""
    c0, u0 = evalsha_stats(r)
    t0 = time.perf_counter()
    out = fn()
    wall = (time.perf_counter() - t0) * 1000
    c1, u1 = evalsha_stats(r)
    _need(c1 - c0 == 1, f"one script call per sweep (saw {c1 - c0})")
    return out, (u1 - u0) / 1000, wall


def claim_all(q: ReliableQueue, n: int) -> None:
    got = 0
    while got < n:
        batch = q.claim(timeout=0, count=min(1000, n - got))
        _need(bool(batch), f"claimed {got} of {n}")
        got += len(batch)


# -- belayq -------------------------------------------------------------------------------


class BelayqCase:
    """One mode's queue at one held count: the producer/measuring object ``q`` and the
    ``holder`` that keeps N claims."""

    def __init__(self, r: redis.Redis, mode: str) -> None:
        self.r, self.mode = r, mode
        tag = uuid.uuid4().hex[:8]
        self.name = f"bench-scale-{mode}-{tag}"
        self.opts: dict[str, Any] = {"keeper": False}
        if mode == "envelopes":
            self.ready = f"bench-kq-{tag}"
            self.opts.update(ready_key=self.ready, payload_in_list=True)
        self.q = self.queue(LEASE_MS)
        self.holder = self.queue(LEASE_MS)
        self.made = 0

    def queue(self, lease_ms: int) -> ReliableQueue:
        return ReliableQueue(self.r, self.name, lease_ms=lease_ms, **self.opts)

    def payloads(self, n: int) -> list[bytes]:
        start, self.made = self.made, self.made + n
        if self.mode == "ids":
            return id_payloads(n, f"m{start:09d}")
        return envelopes(n, self.ready, start)

    def publish(self, n: int) -> None:
        if n:
            self.q.publish_many(self.payloads(n), batch=500)

    def fill(self, n: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        m0 = used_memory(self.r)
        self.publish(n)
        m1 = used_memory(self.r)
        claim_all(self.holder, n)
        m2 = used_memory(self.r)
        s = self.q.stats()
        _need(s["in_flight"] == n and s["leased"] == n and s["ready"] == 0, f"held: {s}")
        return {
            "fill_s": time.perf_counter() - t0,
            "bytes_per_ready": (m1 - m0) / n if n else None,
            "bytes_per_held": (m2 - m0) / n if n else None,
        }

    def rep(self, held: int, ops: int, sweeps: int, reclaims: int) -> dict[str, Any]:
        q = self.q
        self.publish(ops)
        c0, u0 = evalsha_stats(self.r)
        t0 = time.perf_counter()
        for _ in range(ops):
            d = q.claim(timeout=0, count=1)[0]
            _need(q.ack(d), "ack refused")
        rate = ops / (time.perf_counter() - t0)
        c1, u1 = evalsha_stats(self.r)
        _need(c1 - c0 >= 2 * ops, "claim+ack ran as scripts")

        server, wall = [], []
        for _ in range(sweeps):
            _, s_ms, w_ms = timed_script(self.r, q.sweep)
            server.append(s_ms)
            wall.append(w_ms)

        short = self.queue(200)
        r_server, r_wall = [], []
        for _ in range(reclaims):
            self.publish(RECLAIM_N)
            claim_all(short, RECLAIM_N)
            time.sleep(0.35)  # the 200 ms leases expire (server clock)
            res, s_ms, w_ms = timed_script(self.r, q.sweep)
            _need(res.reclaimed == RECLAIM_N,
                  f"sweep reclaimed {res.reclaimed} of {RECLAIM_N}")
            r_server.append(s_ms)
            r_wall.append(w_ms)
            back = q.claim(timeout=0, count=RECLAIM_N)  # the reclaimed ones, off the books
            _need(len(back) == RECLAIM_N and all(q.ack_many(back)), "reclaimed drained")
        s = q.stats()
        _need(s["in_flight"] == held and s["ready"] == 0, f"after rep: {s}")
        return {"claim_ack_per_s": rate, "claim_ack_server_us": (u1 - u0) / ops,
                "sweep_server_ms": med_or_none(server),
                "sweep_wall_ms": med_or_none(wall), "reclaim_server_ms": med_or_none(r_server),
                "reclaim_wall_ms": med_or_none(r_wall)}


# -- stock kombu --------------------------------------------------------------------------


def unacked_entry(envelope: bytes) -> tuple[str, str]:
    """(delivery tag, hash value) exactly as kombu's ``QoS.append`` writes them."""
    from kombu.utils.json import dumps, loads

    raw = loads(envelope)
    info = raw["properties"]["delivery_info"]
    return raw["properties"]["delivery_tag"], dumps([raw, info["exchange"], info["routing_key"]])


def kombu_url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


def check_unacked_format(r: redis.Redis, port: int) -> None:
    """One real ``basic_get(no_ack=False)``: its ``unacked`` entry must be ours, byte for
    byte, and its ``unacked_index`` score a ``time()``."""
    import kombu

    name = f"bench-ks-check-{uuid.uuid4().hex[:8]}"
    env = envelopes(1, name)[0]
    r.lpush(name, env)
    with kombu.Connection(kombu_url(port)) as conn:
        ch = conn.default_channel
        msg = ch.basic_get(name, no_ack=False)
        _need(msg is not None, "basic_get got the check message")
        tag, value = unacked_entry(env)
        _need(msg.delivery_tag == tag, "delivery tag")
        _need(r.hget("unacked", tag) == value.encode(), "unacked hash entry format")
        score = r.zscore("unacked_index", tag)
        _need(score is not None and abs(score - time.time()) < 60, "unacked_index score")
        msg.ack()
    _need(r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0, "check acked")


class StockCase:
    """Stock kombu on the redis:// transport, with N messages unacked by somebody else."""

    def __init__(self, r: redis.Redis, port: int) -> None:
        self.r, self.port = r, port
        self.name = f"bench-ks-{uuid.uuid4().hex[:8]}"
        self.made = 0

    def fill(self, n: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        m0 = used_memory(self.r)
        now = time.time()
        for start in range(0, n, 500):
            pipe = self.r.pipeline(transaction=False)
            for env in envelopes(min(500, n - start), self.name, start):
                tag, value = unacked_entry(env)
                pipe.zadd("unacked_index", {tag: now})
                pipe.hset("unacked", tag, value)
            pipe.execute()
        self.made = n
        m1 = used_memory(self.r)
        _need(self.r.hlen("unacked") == n and self.r.zcard("unacked_index") == n, "stock held")
        return {"fill_s": time.perf_counter() - t0,
                "bytes_per_held": (m1 - m0) / n if n else None}

    def rep(self, held: int, ops: int) -> dict[str, Any]:
        import kombu

        envs = envelopes(ops, self.name, self.made)
        self.made += ops
        for start in range(0, ops, 500):
            self.r.lpush(self.name, *envs[start : start + 500])
        ex = kombu.Exchange(self.name, type="direct")
        kq = kombu.Queue(self.name, ex, routing_key=self.name)
        got = [0]

        def on_message(body: Any, message: Any) -> None:
            got[0] += 1
            message.ack()

        with kombu.Connection(kombu_url(self.port)) as conn, \
                kombu.Consumer(conn, [kq], callbacks=[on_message], prefetch_count=1):
            u0 = server_usec(self.r)
            t0 = time.perf_counter()
            while got[0] < ops:
                conn.drain_events(timeout=10)
            rate = ops / (time.perf_counter() - t0)
            u1 = server_usec(self.r)
        _need(self.r.llen(self.name) == 0, "stock drained")
        _need(self.r.hlen("unacked") == held, "stock unacked back to held")
        return {"consume_ack_per_s": rate, "consume_ack_server_us": (u1 - u0) / ops}


# -- running ------------------------------------------------------------------------------


def run_held(r: redis.Redis, port: int, held: int, args: argparse.Namespace) -> dict[str, Any]:
    r.flushdb()
    out: dict[str, Any] = {}
    cases: dict[str, Any] = {m: BelayqCase(r, m) for m in MODES}
    cases["kombu"] = StockCase(r, port)
    for name, case in cases.items():
        out[name] = {"fill": case.fill(held), "reps": []}
        print(f"  held {held:>7,}: {name:9} filled in {out[name]['fill']['fill_s']:5.1f} s",
              flush=True)
    for i in range(args.reps):
        t0 = time.perf_counter()
        for m in MODES:
            out[m]["reps"].append(cases[m].rep(held, args.ops, args.sweeps, args.reclaims))
        out["kombu"]["reps"].append(cases["kombu"].rep(held, args.ops))
        print(f"  held {held:>7,}: rep {i + 1}/{args.reps} in {time.perf_counter() - t0:5.1f} s",
              flush=True)
    for data in out.values():
        keys = data["reps"][0].keys()
        data["median"] = {k: med_or_none([x[k] for x in data["reps"]]) for k in keys}
    r.flushdb()
    return out


def warm_up(r: redis.Redis, port: int, args: argparse.Namespace) -> None:
    """One short untimed round of every loop (connections, scripts, imports, caches)."""
    r.flushdb()
    ops = min(500, args.ops)
    for m in MODES:
        BelayqCase(r, m).rep(0, ops, 1, 1)
    StockCase(r, port).rep(0, ops)
    r.flushdb()


def fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if v is None else format(v, spec) + suffix


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def report(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    helds = sorted(rows)
    base = rows.get(0)
    stock_rate = {n: rows[n]["kombu"]["median"]["consume_ack_per_s"] for n in helds}
    for mode in MODES:
        print(f"\nbelayq, {mode} mode "
              f"({'100 B payloads' if mode == 'ids' else '~1 KB kombu envelopes in the list'})")
        head = (f"{'held':>8} | {'claim+ack/s':>11} | {'vs held=0':>9} | {'srv us/op':>9} | "
                f"{'sweep srv ms':>12} | "
                f"{'(wall ms)':>9} | {'reclaim 1k ms':>13} | {'B/held msg':>10} | "
                f"{'B/ready msg':>11}")
        if mode == "envelopes":
            head += f" | {'stock kombu/s':>13} | {'belayq/stock':>12}"
        print(head)
        print("-" * len(head))
        for n in helds:
            m, f = rows[n][mode]["median"], rows[n][mode]["fill"]
            b0 = base[mode]["median"]["claim_ack_per_s"] if base else None
            line = (f"{n:>8,} | {m['claim_ack_per_s']:>11,.0f} | "
                    f"{fmt(ratio(m['claim_ack_per_s'], b0), '.2f', 'x'):>9} | "
                    f"{m['claim_ack_server_us']:>9.0f} | "
                    f"{m['sweep_server_ms']:>12.2f} | {m['sweep_wall_ms']:>9.2f} | "
                    f"{m['reclaim_server_ms']:>13.2f} | {fmt(f['bytes_per_held'], ',.0f'):>10} | "
                    f"{fmt(f['bytes_per_ready'], ',.0f'):>11}")
            if mode == "envelopes":
                line += (f" | {stock_rate[n]:>13,.0f} | "
                         f"{fmt(ratio(m['claim_ack_per_s'], stock_rate[n]), '.2f', 'x'):>12}")
            print(line)
    print("\nstock kombu (redis://), consume+ack prefetch 1, ~1 KB envelopes, N unacked held")
    head = (f"{'held':>8} | {'consume+ack/s':>13} | {'vs held=0':>9} | {'srv us/op':>9} | "
            f"{'B/held msg':>10}")
    print(head)
    print("-" * len(head))
    for n in helds:
        s0 = stock_rate[0] if base else None
        us = rows[n]["kombu"]["median"]["consume_ack_server_us"]
        print(f"{n:>8,} | {stock_rate[n]:>13,.0f} | {fmt(ratio(stock_rate[n], s0), '.2f', 'x'):>9}"
              f" | {us:>9.0f} | {fmt(rows[n]['kombu']['fill']['bytes_per_held'], ',.0f'):>10}")
    return targets(rows)


def targets(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each target, judged at 100k held (or at the largest N run, flagged as such)."""
    top = max(rows)
    at = "" if top >= 100_000 else f"  [judged at {top:,} held: 100k not run]"
    med_of = {m: rows[top][m]["median"] for m in (*MODES, "kombu")}
    out: dict[str, Any] = {"judged_at_held": top}
    print(f"\nTARGETS{at}")

    def verdict(key: str, text: str, ok: bool | None, got: str) -> None:
        out[key] = {"target": text, "measured": got, "met": ok}
        shown = "n/a " if ok is None else ("MET " if ok else "MISS")
        print(f"  [{shown}] {text}: {got}")

    if 0 in rows:
        r = {m: ratio(med_of[m]["claim_ack_per_s"], rows[0][m]["median"]["claim_ack_per_s"])
             for m in MODES}
        verdict("claim_ack_ratio", TARGETS[0][1], all(v >= 0.8 for v in r.values() if v),
                ", ".join(f"{m} {v:.2f}x" for m, v in r.items() if v is not None))
    else:
        verdict("claim_ack_ratio", TARGETS[0][1], None, "held=0 not run")
    sw = {m: med_of[m]["sweep_server_ms"] for m in MODES}
    verdict("sweep_ms", TARGETS[1][1], all(v <= 10 for v in sw.values()),
            ", ".join(f"{m} {v:.2f} ms" for m, v in sw.items()))
    rc = {m: max(rows[n][m]["median"]["reclaim_server_ms"] for n in rows) for m in MODES}
    verdict("reclaim_ms", TARGETS[2][1], all(v <= 50 for v in rc.values()),
            ", ".join(f"{m} {v:.2f} ms (worst over N)" for m, v in rc.items()))
    vs = ratio(med_of["envelopes"]["claim_ack_per_s"], med_of["kombu"]["consume_ack_per_s"])
    verdict("vs_stock", TARGETS[3][1], vs is not None and vs >= 1.0, f"{vs:.2f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--held", default=None, help="held counts, comma separated "
                    "(default 0,1000,10000,100000; --quick: 0,1000,10000)")
    ap.add_argument("--ops", type=int, default=None,
                    help="claim+ack (and stock consume+ack) messages per rep (default 3000; "
                    "--quick: 1000)")
    ap.add_argument("--sweeps", type=int, default=None, help="full sweeps timed per rep "
                    "(default 20; --quick: 10)")
    ap.add_argument("--reclaims", type=int, default=3, help="reclaims of 1,000 expired leases "
                    "timed per rep (one sweep each; median)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args(argv)
    args.held = args.held or ("0,1000,10000" if args.quick else "0,1000,10000,100000")
    helds = sorted({int(x.replace("_", "")) for x in args.held.split(",") if x.strip()})
    args.ops = args.ops or (1000 if args.quick else 3000)
    args.sweeps = args.sweeps or (10 if args.quick else 20)
    _need(min(args.ops, args.sweeps, args.reclaims, args.reps) > 0,
          "positive --ops/--sweeps/--reclaims/--reps")

    started = time.perf_counter()
    with RedisServer() as server:
        r = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=60)
        env = environment(r, server.port)
        print(f"redis-server {server.binary} ({env['redis_version']}) on port {server.port}; "
              f"held {', '.join(f'{n:,}' for n in helds)}; ops {args.ops}, sweeps "
              f"{args.sweeps}, reclaims {args.reclaims}, reps {args.reps} (medians); server "
              "times from INFO commandstats (cmdstat_evalsha/fcall usec/calls)", flush=True)
        size = statistics.mean(len(e) for e in envelopes(100, "bench-kq-size"))
        print(f"envelopes: Celery protocol-2 kombu JSON, {size:.0f} B each (mean)", flush=True)
        check_unacked_format(r, server.port)
        warm_up(r, server.port, args)
        rows = {n: run_held(r, server.port, n, args) for n in helds}
        verdicts = report(rows)
    took = time.perf_counter() - started
    print(f"\ntotal {took:.0f} s; load average at start {env['loadavg_start'][0]:.2f}, "
          f"at end {os.getloadavg()[0]:.2f} (1 min; the box has {os.cpu_count()} CPUs)")
    results = {"environment": env, "args": {k: str(v) for k, v in vars(args).items()},
               "seconds": took, "envelope_bytes": size,
               "server_time_source": "INFO commandstats cmdstat_evalsha + cmdstat_fcall",
               "held": {str(n): v for n, v in rows.items()}, "targets": verdicts}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
