"""The text report of one run: throughput, round trips, memory, recovery."""

from __future__ import annotations

from typing import Any

from benchmarks.stats import med, span, table

from .loops import LOOP_LABELS, THROUGHPUT_ROWS

MEMORY_ROWS = [
    # (state, belayq figure, raw figure)
    ("queued, right after publish", "bq_queued", "raw_queued"),
    ("queued, steady (TTL'd keys gone)", "bq_queued_steady", "raw_queued"),
    ("in flight, right after claim", "bq_inflight", "raw_inflight"),
    ("in flight, steady (TTL'd keys gone)", "bq_inflight_steady", "raw_inflight"),
    ("extra for being in flight, steady", "bq_inflight_extra", "raw_inflight_extra"),
]


def report(res: dict[str, Any]) -> str:
    a = res["args"]
    env = res["env"]
    hiredis_txt = f"yes {env['hiredis_version']}" if env["hiredis"] else "no"
    out = [
        f"belayq benchmarks.core: n={a['n']} reps={a['reps']} payload={a['payload_bytes']} B "
        f"batch={a['batch']} elapsed={res['elapsed_s']:.0f} s",
        f"env: redis-server {env['redis_version']} (port {env['redis_port']}), "
        f"redis-py {env['redis_py']}, hiredis {hiredis_txt}, "
        f"RESP{env['resp_protocol']}, Python {env['python']}, "
        f"belayq {env['belayq']} from {env['belayq_source']}, "
        f"CPUs {env['cpu_count']} (usable {env['cpus_usable']}), "
        f"load avg start {env['loadavg_start'][0]:.2f} end {res['loadavg_end'][0]:.2f}",
    ]
    out += throughput_section(res["throughput"], a["batch"])
    out += server_cpu_section(res["throughput"], a["batch"])
    if res.get("breakdown"):
        out += breakdown_section(res["breakdown"], a["batch"])
    out += round_trips_section(res["throughput"], a["batch"])
    if res["memory"]:
        out += memory_section(res["memory"], a)
    if res["recovery"]:
        out += recovery_section(res["recovery"], a)
    return "\n".join(out)


def throughput_section(loops: dict[str, list[dict[str, Any]]], b: int) -> list[str]:
    def rates(name: str) -> list[float]:
        return [s["rate"] for s in loops[name]]

    rows = []
    for label, bq, raw in THROUGHPUT_ROWS:
        ratio = med(rates(bq)) / med(rates(raw))
        paired = [x / y for x, y in zip(rates(bq), rates(raw), strict=True)]
        rows.append([
            label.format(b=b),
            span(rates(bq), ",.0f"),
            LOOP_LABELS[raw].format(b=b),
            span(rates(raw), ",.0f"),
            f"{ratio:.2f}",
            span(paired, ".2f"),
        ])
    return [
        "\n## Throughput (msg/s, median (min-max) over reps)\n",
        table(["loop", "belayq msg/s", "raw loop", "raw msg/s", "belayq/raw", "same-rep ratios"],
              rows),
        "belayq/raw = ratio of the medians; same-rep ratios = median (min-max) of each rep's "
        "belayq/raw, measured seconds apart, which cancels part of the host's drift.",
    ]


#: The server-CPU targets: (belayq loop, raw loop) -> the most belayq/raw may be.
CPU_TARGETS = {
    ("bq_publish", "raw_lpush"): 1.3,
    ("bq_claim1_ack", "raw_blmove_lrem"): 1.3,
    ("bq_claim100_ack_many", "raw_blmove_lrem"): 0.15,
}


def server_cpu_section(loops: dict[str, list[dict[str, Any]]], b: int) -> list[str]:
    def cpu(name: str) -> list[float]:
        return [s["server_cpu_us_per_msg"] for s in loops[name]]

    rows = []
    for label, bq, raw in THROUGHPUT_ROWS:
        paired = [x / y for x, y in zip(cpu(bq), cpu(raw), strict=True)]
        target = CPU_TARGETS.get((bq, raw))
        rows.append([
            label.format(b=b),
            span(cpu(bq), ".1f"),
            LOOP_LABELS[raw].format(b=b),
            span(cpu(raw), ".1f"),
            span(paired, ".2f"),
            f"<= {target}" if target else "-",
            ("met" if med(paired) <= target else "NOT met") if target else "-",
        ])
    return [
        "\n## Server CPU per message (us, INFO cpu user+sys delta / n, median (min-max))\n",
        table(["path", "belayq", "raw floor", "floor", "belayq/floor (same rep)", "target",
               ""], rows),
        "Everything the server process spent while the loop ran: the scripts, the commands, "
        "the socket reads and writes of every round trip, and the lease keeper's calls. One "
        "Redis core is the ceiling of one hot queue: this bounds a node's messages per second.",
    ]


def breakdown_section(reps: list[dict[str, dict[str, Any]]], b: int) -> list[str]:
    shipped = "as shipped"
    noop = "no-op call, same keys and arguments"
    paths = list(reps[0][shipped])

    def col(part: str, p: str, i: int) -> list[float]:
        return [r[part][p][i] for r in reps]

    rows = [
        [shipped + ": server CPU", *(span(col(shipped, p, 0), ".1f") for p in paths)],
        [shipped + ": the scripts' time", *(span(col(shipped, p, 1), ".1f") for p in paths)],
    ]
    for part in reps[0]:
        if part in (shipped, noop):
            continue
        saved = [[x - y for x, y in zip(col(shipped, p, 1), col(part, p, 1), strict=True)]
                 for p in paths]
        rows.append(["  " + part, *(span(x, ".1f") for x in saved)])
    rows.append([noop + ": server CPU",
                 *(f"{med([r[noop][p] for r in reps]):.1f}" for p in paths)])
    return [
        "\n## Server time per message, part by part (us, median (min-max) over reps)\n",
        table(["part", *(p.format(b=b) for p in paths)], rows),
        "Server CPU = INFO cpu delta / n (all of it: I/O too); the scripts' time = INFO "
        "commandstats usec of the function calls / n. Each indented part is what the scripts' "
        "time dropped by without it (a benchmark-only edit of the Lua, or one priority level "
        "instead of ten), in the same rep. The no-op row is the server CPU of calling a "
        "function that does nothing with the same keys and arguments (socket I/O, parsing, the "
        "call): the floor no script goes below.",
    ]


def round_trips_section(loops: dict[str, list[dict[str, Any]]], b: int) -> list[str]:
    rows = []
    for name, label in LOOP_LABELS.items():
        ss = loops[name]
        rows.append([
            label.format(b=b),
            f"{med([s['rt_per_msg'] for s in ss]):.3f}",
            f"{med([s['cmds_per_msg'] for s in ss]):.3f}",
            f"{med([s['server_cmds_per_msg'] for s in ss]):.2f}",
            f"{med([s.get('server_usec_per_msg', 0.0) for s in ss]):.1f}",
            str(sum(s["keeper_rt"] for s in ss)),
        ])
    return [
        "\n## Round trips and commands per message (median over reps)\n",
        table(["loop", "RT/msg", "cmds/msg sent", "cmds/msg run by server", "server us/msg",
               "keeper RTs (all reps)"], rows),
        "RT = client writes+reads (a pipeline or MULTI block is 1); 'sent' = top-level commands "
        "the client sent; 'run by server' = INFO commandstats delta, which counts every "
        "command inside Lua and the lease keeper's heartbeats too; 'server us/msg' = server time "
        "of the scripts or functions (of the raw commands, for a raw loop) per message.",
    ]


def memory_section(mem: list[dict[str, float]], a: dict[str, Any]) -> list[str]:
    b = a["batch"]

    def m(key: str) -> float:
        return med([x.get(key, 0.0) for x in mem])

    rows = []
    for label, bq, raw in MEMORY_ROWS:
        bv = [x[bq] for x in mem]
        rv = [x[raw] for x in mem]
        mem_ratio = f"{med(bv) / med(rv):.2f}" if abs(med(rv)) > 5 else "-"
        rows.append([label, span(bv, ".0f"), span(rv, ".0f"), mem_ratio])
    return [
        "\n## Redis memory per message "
        f"(used_memory delta / n, {a['payload_bytes']} B payload)\n",
        table(["state", "belayq id mode B/msg", "raw list B/msg", "belayq/raw"], rows),
        f"MEMORY USAGE breakdown (B per message): payloads hash {m('bq_payloads_queued'):.0f}, "
        f"ready list {m('bq_ready_list'):.0f}; claimed: meta hash {m('bq_meta_inflight'):.0f}, "
        f"leases zset {m('bq_leases_zset'):.0f}, landing list {m('bq_processing_list'):.0f}; "
        f"raw list {m('raw_list'):.0f}. used_memory also counts allocator slack and hash "
        "tables grown in powers of 2, so the deltas differ from the sum.",
        f"Memo records (re-send replies) per message: {m('bq_transient_after_publish'):.2f} "
        f"after publish_many({b}), {m('bq_transient_after_claim'):.3f} after "
        f"claim(count={b}) (longest TTL {m('bq_transient_ttl_s'):.0f} s); 'right after' "
        "includes them, 'steady' is measured after deleting them. Under a sustained "
        "rate they cost about rate x TTL x their size.",
    ]


def recovery_section(recoveries: list[dict[str, Any]], a: dict[str, Any]) -> list[str]:
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for rec in recoveries:
        groups.setdefault((rec["system"], rec["lease_ms"], rec["consumer"]), []).append(rec)
    consumer_text = {
        "poll": f"claim(timeout={a['poll_s']}) in a loop",
        "blocked": "one blocked claim() (its keeper sweeps)",
        "blocked-nokeeper": "one blocked claim(), keeper=False",
    }
    rows = []
    for (system, lease, consumer), recs in groups.items():
        rec_s = [x["recovered_s"] for x in recs if x["recovered_s"] is not None]
        never = len(recs) - len(rec_s)
        if system != "belayq":
            rec_txt = f"never: not in {recs[0]['window_s']:.0f} s ({never}/{len(recs)} runs)"
            left_txt, early_txt, deliv_txt = "no lease", "-", "-"
            label = "raw: BLMOVE q p loop (timeout " + str(a["poll_s"]) + " s)"
            strand = str(recs[0]["stranded_in_processing"])
        else:
            rec_txt = span(rec_s, ".2f") if rec_s else "never"
            if never and rec_s:
                rec_txt += f"; {never} never"
            lefts = [
                x["lease_left_at_kill_ms"] for x in recs if x["lease_left_at_kill_ms"] is not None
            ]
            left_txt = span(lefts, ".0f") if lefts else "-"
            early_txt = str(sum(x["redelivered_while_alive"] for x in recs))
            deliv_txt = ",".join(str(x["deliveries"]) for x in recs)
            label = consumer_text[consumer]
            strand = str(max(x["stranded_in_processing"] or 0 for x in recs))
        rows.append([
            system, str(lease) if lease else "-", label, str(len(recs)), left_txt,
            rec_txt, early_txt, deliv_txt, strand,
        ])
    return [
        "\n## Recovery after kill -9 of the consumer holding the message\n",
        table(["system", "lease_ms", "other consumer", "runs", "lease left at kill ms",
               "kill -> redelivered s", "redelivered before kill", "delivery no.",
               "stuck in processing"], rows),
        "The dying consumer held the message for lease+0.5 s before the kill, so its keeper "
        "had to extend the lease; 'redelivered before kill' counts runs where the watching "
        "consumer got it while the holder was alive (should be 0).",
    ]
