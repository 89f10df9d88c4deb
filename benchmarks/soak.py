"""The soak: Celery, RQ and Dramatiq workers on one Redis, with tracing on, the dashboard and
the exporter polling, failures, retries, delays, dead letters and kill -9s; then a drain and
a census of what the server still holds.

    uv run python -m benchmarks.soak --minutes 30

It starts its own redis-server (a free port of 127.0.0.1; no persistence) and a second one
for the ledger, records DBSIZE, ``used_memory`` and the key patterns at start, sends tasks at
``--rate`` per second and framework for ``--minutes``, kills a worker (or one of its
children) with SIGKILL every ``--kill-every`` seconds (at most ``--max-kills``), and polls
the dashboard's API and the exporter every ``--poll-every`` seconds. Then it drains (every
task reaches its end: done, failed in its framework, or dead-lettered), deletes the dead
letters through the dashboard as an operator would, stops the workers, checks that the
tools' reads alone write nothing, and reports: sent, completed, lost (must be 0), runs
twice, DBSIZE and memory at start and at the end, and every key left, grouped by pattern,
as kept on purpose within a documented cap (named) or LEAK. It exits 1 on a loss, a write
by a read, or a leak. See docs/proof.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from belayq.embedded import RedisServer, free_port
from belayq.models import text

from .chaos.servers import binary
from .soaking import census, ledger
from .soaking.fleet import FRAMEWORKS, Fleet, FleetConfig, Producers, Tool, get, post
from .soaking.report import Outcome, judge_tasks, render

log = logging.getLogger("soak")


def plan_task(rng: random.Random) -> tuple[str, float, float]:
    """(plan, seconds, delay in s) of one task, at random: mostly short successes, some slow
    ones, failures, retries, delayed ones and a few poison messages."""
    x = rng.random()
    seconds = round(rng.uniform(0.005, 0.08), 3)
    if x < 0.05:
        return "slow", round(rng.uniform(2.0, 6.0), 2), 0.0
    if x < 0.11:
        return "fail", seconds, 0.0
    if x < 0.19:
        return f"retry:{rng.choice((1, 2))}", seconds, 0.0
    if x < 0.29:
        return "ok", seconds, round(rng.uniform(1.0, 20.0), 2)
    if x < 0.305:
        return "dead", seconds, 0.0
    return "ok", seconds, 0.0


class Poller(threading.Thread):
    """Reads the dashboard's API (the overview, each queue's page, a search) and the
    exporter's metrics every ``every`` s, counting answers and errors."""

    def __init__(self, dashboard: Tool, exporter: Tool, every: float, sent: list[str]) -> None:
        super().__init__(daemon=True)
        self.dashboard, self.exporter, self.every, self.sent = dashboard, exporter, every, sent
        self.stopped = threading.Event()
        self.counts = {"dashboard": 0, "exporter": 0, "errors": 0, "rounds": 0}
        self.errors: list[str] = []
        self.slowest_s = 0.0

    def _get(self, tool: str, url: str) -> bytes | None:
        t0 = time.monotonic()
        try:
            body = get(url)
            self.counts[tool] += 1
            return body
        except Exception as exc:
            self.counts["errors"] += 1
            if len(self.errors) < 20:
                self.errors.append(f"{url}: {exc!r}")
            return None
        finally:
            self.slowest_s = max(self.slowest_s, time.monotonic() - t0)

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.poll()

    def poll(self) -> None:
        """One round: the overview, each queue's page, a search, the metrics."""
        from urllib.parse import quote

        d = self.dashboard.base()
        self.counts["rounds"] += 1
        body = self._get("dashboard", d + "/api/overview")
        for row in json.loads(body or b"{}").get("queues", []):
            self._get("dashboard", f"{d}/api/queue/{row['kind']}/{quote(row['queue'])}")
        if self.sent:
            self._get("dashboard", f"{d}/api/search?id={quote(self.sent[-1])}")
        self._get("exporter", self.exporter.base() + "/metrics")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="traffic phase (default 30)")
    p.add_argument("--rate", type=float, default=2.0,
                   help="tasks sent per second, per framework (default 2)")
    p.add_argument("--workers", type=int, default=2, help="workers per framework (default 2)")
    p.add_argument("--kill-every", type=float, default=20.0,
                   help="seconds between two kill -9s, +-30%% (default 20)")
    p.add_argument("--max-kills", type=int, default=None,
                   help="most kill -9s (default: one per --kill-every over the run, at most 200)")
    p.add_argument("--poll-every", type=float, default=3.0,
                   help="seconds between two polls of the dashboard and exporter (default 3)")
    p.add_argument("--lease", type=float, default=5.0, help="the lease, s (default 5)")
    p.add_argument("--max-deliveries", type=int, default=5)
    p.add_argument("--drain-timeout", type=float, default=300.0)
    p.add_argument("--memory-slack-kib", type=int, default=64,
                   help="memory the server may hold at the end beyond its start once its keys, "
                   "slow log, caches and statistics are freed, KiB (default 64)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--logdir", type=Path, default=Path("/tmp/belayq-soak"))
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    if not 0 < args.minutes <= 24 * 60 or not 0 < args.rate <= 100 or not 1 <= args.workers <= 8:
        p.error("--minutes must be within (0, 1440], --rate within (0, 100], --workers 1..8")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    max_kills = args.max_kills if args.max_kills is not None else min(
        200, int(args.minutes * 60 / args.kill_every))
    logdir = args.logdir / f"soak-{uuid.uuid4().hex[:8]}"
    logdir.mkdir(parents=True)
    broker = RedisServer(binary()).start()  # 127.0.0.1, a free port, no persistence
    ledger_server = RedisServer(binary()).start()
    try:
        outcome = soak(args, max_kills, logdir, broker, ledger_server)
    finally:
        broker.stop()
        ledger_server.stop()
    print(render(outcome))
    if args.json:
        args.json.write_text(json.dumps(outcome.to_json(), indent=1, default=str))
    return 0 if outcome.ok else 1


def soak(args: argparse.Namespace, max_kills: int, logdir: Path, broker: RedisServer,
         ledger_server: RedisServer) -> Outcome:
    r = redis.Redis(host="127.0.0.1", port=broker.port)
    lr = redis.Redis(host="127.0.0.1", port=ledger_server.port)
    queues = {f: f"soak-{f}" for f in FRAMEWORKS}
    start_memory = census.memory(r)
    start_stats = census.memory_stats(r)
    start_patterns = sorted({k.pattern for k in census.scan(r, queues)})
    ledger_url = f"redis://127.0.0.1:{ledger_server.port}/0"
    os.environ.update(SOAK_LEASE_S=str(args.lease), SOAK_MAX_DELIVERIES=str(args.max_deliveries),
                      SOAK_LEDGER_URL=ledger_url)
    producer_spans = ledger.trace("producer")  # the producers below are traced
    cfg = FleetConfig(port=broker.port, ledger_url=ledger_url,
                      logdir=logdir, lease_s=args.lease, max_deliveries=args.max_deliveries,
                      workers=args.workers, queues=queues)
    fleet = Fleet(cfg)
    producers = Producers(cfg)
    tools: list[Tool] = []
    sent: dict[str, tuple[str, str, float]] = {}  # task id -> (framework, plan, delay)
    order: list[str] = []
    kills: list[dict[str, Any]] = []
    rng = random.Random(args.seed)
    try:
        log.info("starting %d workers per framework", args.workers)
        fleet.start_all()
        # the tools start once the queues are known (their workers registered them)
        for f in FRAMEWORKS:  # a first task each, so every queue exists before the tools
            _send(producers, sent, order, f, f"sk-{f[0]}{0:06d}", ("ok", 0.01, 0.0))
        time.sleep(2)
        dashboard = Tool("dashboard", cfg.url, free_port(), logdir)
        exporter = Tool("exporter", cfg.url, free_port(), logdir)
        tools = [dashboard, exporter]
        dashboard.wait_ready("/api/overview")
        exporter.wait_ready("/metrics")
        baseline = census.memory(r)
        poller = Poller(dashboard, exporter, args.poll_every, order)
        poller.start()
        t0 = time.time()
        end = t0 + args.minutes * 60
        next_send = dict.fromkeys(FRAMEWORKS, t0)
        counter = dict.fromkeys(FRAMEWORKS, 0)
        next_kill = t0 + args.kill_every * rng.uniform(0.7, 1.3)
        next_note = t0
        paused_at = t0 + args.minutes * 30  # once, half-way: pause and resume each queue
        while time.time() < end:
            now = time.time()
            for f in FRAMEWORKS:
                while next_send[f] <= now:
                    counter[f] += 1
                    _send(producers, sent, order, f, f"sk-{f[0]}{counter[f]:06d}",
                          plan_task(rng))
                    next_send[f] += 1 / args.rate
            if now >= next_kill and len(kills) < max_kills:
                hit = fleet.kill(rng)
                if hit:
                    kills.append(hit)
                    log.info("kill -9 %s %s %s", hit["framework"], hit["what"], hit["pids"])
                next_kill = now + args.kill_every * rng.uniform(0.7, 1.3)
            if paused_at and now >= paused_at:
                try:
                    _pause_resume(dashboard, queues)
                except Exception as exc:  # reported with the polls' errors
                    poller.counts["errors"] += 1
                    poller.errors.append(f"pause/resume from the dashboard: {exc!r}")
                paused_at = 0
            fleet.replace_dead()
            if now >= next_note:
                log.info("%5.0fs sent %d, runs ended %d, kills %d, workers replaced %d",
                         now - t0, len(sent), lr.llen(ledger.LEDGER + "ends"), len(kills),
                         fleet.replaced)
                next_note = now + 15
            time.sleep(0.05)
        log.info("traffic over: %d sent; draining", len(sent))
        t_drain = time.time()
        while time.time() - t_drain < args.drain_timeout:
            fleet.replace_dead()
            waiting = judge_tasks(sent, lr, r, queues, final=False).waiting
            if not waiting:
                break
            if time.time() >= next_note:
                log.info("drain: %d tasks not at their end yet", len(waiting))
                next_note = time.time() + 15
            time.sleep(1)
        drain_s = time.time() - t_drain
        time.sleep(args.lease * 2)  # a run still going (a duplicate) ends first
        tasks = judge_tasks(sent, lr, r, queues, final=True, max_deliveries=args.max_deliveries)
        deleted = _delete_dead(dashboard)
        poller.stopped.set()
        poller.join(60)
        stopped_hard = fleet.stop()
        # With nothing else running, the tools' reads must leave every key as it was.
        tool_writes = census.writes_during(r, lambda: _rounds(poller, 3))
    finally:
        for t in tools:
            t.stop()
        fleet.stop()
        producers.close()
    time.sleep(2)
    end_memory = census.memory(r)
    end_stats = census.memory_stats(r)
    keys = census.scan(r, queues)
    groups = census.classify(keys, census.context(r))
    parts = census.decompose(r)
    spans = {text(k): int(v) for k, v in lr.hgetall(ledger.LEDGER + "spans").items()}
    del producer_spans
    return Outcome(
        minutes=args.minutes, rate=args.rate, workers=args.workers, tasks=tasks,
        kills=kills, workers_started=len(fleet.started), stopped_hard=stopped_hard,
        poll=dict(poller.counts), poll_errors=poller.errors, poll_slowest_s=poller.slowest_s,
        drain_s=drain_s, dead_deleted=deleted, start=start_memory, baseline=baseline,
        end=end_memory, start_patterns=start_patterns, groups=groups, spans=spans,
        memory_slack=args.memory_slack_kib * 1024, logdir=str(logdir),
        memory_stats={"start": start_stats, "end": end_stats, "decompose": parts},
        tool_writes=tool_writes)


def _rounds(poller: Poller, n: int) -> None:
    for _ in range(n):
        poller.poll()


def _send(producers: Producers, sent: dict[str, tuple[str, str, float]], order: list[str],
          framework: str, task_id: str, task: tuple[str, float, float]) -> None:
    plan, seconds, delay = task
    producers.send(framework, task_id, plan, seconds, delay)
    sent[task_id] = (framework, plan, delay)
    order.append(task_id)
    del order[:-100]


def _pause_resume(dashboard: Tool, queues: dict[str, str]) -> None:
    """Pause each queue from the dashboard, and resume it 2 s later."""
    from urllib.parse import quote

    rows = json.loads(get(dashboard.base() + "/api/overview"))["queues"]
    mine = [row for row in rows if row["queue"] in queues.values()]
    for row in mine:
        post(f"{dashboard.base()}/api/queue/{row['kind']}/{quote(row['queue'])}/pause", {})
    time.sleep(2)
    for row in mine:
        post(f"{dashboard.base()}/api/queue/{row['kind']}/{quote(row['queue'])}/resume", {})
    log.info("paused and resumed %s from the dashboard", [row["queue"] for row in mine])


def _delete_dead(dashboard: Tool) -> dict[str, Any]:
    """Delete every queue's dead letters through the dashboard, as an operator would."""
    from urllib.parse import quote

    out: dict[str, Any] = {}
    for row in json.loads(get(dashboard.base() + "/api/overview"))["queues"]:
        if not row.get("dead"):
            continue
        url = f"{dashboard.base()}/api/queue/{row['kind']}/{quote(row['queue'])}/delete"
        try:
            out[row["queue"]] = json.loads(post(url, {"all": True, "confirm": row["queue"]}))
        except Exception as exc:
            out[row["queue"]] = {"error": repr(exc)}
    return out


if __name__ == "__main__":
    sys.exit(main())
