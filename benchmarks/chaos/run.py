"""One stack under one fault schedule: start the workers, publish the workload while faults
are injected, replace killed workers, drain, and analyse the ledger."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from kombu.exceptions import OperationalError

from . import procs
from .analysis import Published, analyse, failover_windows
from .faults import Fault, Injector, PlannedFault, default_kinds, make_schedule
from .ledger import Execution, LedgerReader
from .servers import SENTINEL_DOWN_AFTER_MS, LedgerServer, make_broker
from .stacks import HARNESS_CLIENT, StackConfig, WorkerProc, make_stack

log = logging.getLogger("chaos")
FAULT_PATIENCE_S = 5.0  # how long a fault may wait for a target (a child running a task)


@dataclass
class RunConfig:
    """One comparison's settings (every stack runs with the same)."""

    tasks: int = 10_000
    minutes: float = 5.0
    seed: int = 1
    lease_s: float = 5.0
    sweep_s: float = 0.5
    fault_every_s: float = 4.0
    workers: int = 4
    concurrency: int = 2
    long_share: float = 0.005
    eta_share: float = 0.05
    long_factor: float = 3.0  # long tasks run this many leases
    max_deliveries: int = 50
    drain_timeout_s: float = 300.0
    drain_stall_s: float = 180.0
    ready_timeout_s: float = 120.0
    broker: str = "single"  # single | sentinel | cluster
    wait_replicas: int = 0  # belayq stacks: publishes and settles wait for this many replicas
    logdir: Path = field(default_factory=lambda: Path("/tmp/belayq-chaos"))

    @property
    def duration_s(self) -> float:
        return self.minutes * 60

    @property
    def long_task_s(self) -> float:
        return self.lease_s * self.long_factor

    @property
    def freeze_s(self) -> float:
        return self.lease_s * 1.5 + 1.0


def workload(cfg: RunConfig) -> list[tuple[float, Published]]:
    """(publish offset in s, task) for every task, seeded: mostly 5-50 ms tasks, a share of
    long ones (``long_factor`` x the lease, +-20 %) and of delayed ones (ETA/countdown or
    ``enqueue_in``: 0.5-3 leases), published evenly over the first 90 % of the run."""
    rng = random.Random(cfg.seed * 7919 + 1)
    span = cfg.duration_s * 0.9
    out = []
    for i in range(cfg.tasks):
        x = rng.random()
        seconds = round(rng.uniform(0.005, 0.05), 4)
        delay = 0.0
        if x < cfg.long_share:
            kind, seconds = "long", round(cfg.long_task_s * rng.uniform(0.8, 1.2), 3)
        elif x < cfg.long_share + cfg.eta_share:
            kind, delay = "eta", round(cfg.lease_s * rng.uniform(0.5, 3.0), 3)
        else:
            kind = "short"
        out.append((span * i / cfg.tasks, Published(f"t{i:06d}", kind, seconds, delay, 0.0)))
    return out


def run_stack(stack_name: str, cfg: RunConfig, plan: list[PlannedFault] | None = None,
              progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """Run ``stack_name`` once with its own broker and ledger servers; return the figures."""
    if plan is None:
        plan = make_schedule(cfg.seed, cfg.duration_s, cfg.fault_every_s, default_kinds(cfg.broker))
    run_id = f"{stack_name}-{uuid.uuid4().hex[:8]}"
    logdir = cfg.logdir / run_id
    logdir.mkdir(parents=True, exist_ok=True)
    t_wall = time.time()
    with make_broker(cfg.broker) as broker, LedgerServer() as ledger_server:
        ledger_client = redis.Redis(port=ledger_server.port, client_name=HARNESS_CLIENT)
        ledger = LedgerReader(ledger_client, run_id)
        scfg = StackConfig(
            broker=broker.spec(), ledger_url=ledger_server.url, run=run_id, logdir=logdir,
            lease_s=cfg.lease_s, sweep_s=cfg.sweep_s, max_deliveries=cfg.max_deliveries,
            workers=cfg.workers, concurrency=cfg.concurrency, long_task_s=cfg.long_task_s,
            wait_replicas=cfg.wait_replicas,
        )  # fmt: skip
        stack = make_stack(stack_name, scfg)
        injector = Injector(stack, broker, ledger, cfg.freeze_s)
        workers: list[WorkerProc] = [stack.start_worker() for _ in range(cfg.workers)]
        faults: list[Fault] = []
        events: list[dict[str, Any]] = []
        try:
            stack.wait_ready(workers, cfg.ready_timeout_s)
            result = _drive(cfg, stack, workers, injector, ledger, plan, faults, events, progress)
            stats = _safe(stack.core_stats)
            extra = _safe(stack.extra_stats)
            waiting = _safe(stack.waiting_ids)
        finally:
            injector.thaw_due(force=True)
            _stop_all(stack.started, injector, ledger)
            stack.close()
        executions = ledger.executions()
        ledger_client.close()
        broker_log = broker.log_tail()
        broker.save_logs(logdir)
        switches = broker.switches()
    published = result.pop("published")
    # The raw material, so a run can be analysed again (``--reanalyse``).
    (logdir / "ledger.json").write_text(json.dumps({
        "published": [asdict(p) for p in published],
        "executions": [asdict(e) for e in executions],
        "waiting": waiting,
    }))  # fmt: skip
    windows = failover_windows(faults, switches, SENTINEL_DOWN_AFTER_MS / 1000)
    figures = analyse(published, executions, faults, waiting, windows)
    figures.update(result)
    figures.update({
        "stack": stack_name,
        "broker": cfg.broker,
        "wait_replicas": cfg.wait_replicas,
        "run": run_id,
        "logdir": str(logdir),
        "wall_s": round(time.time() - t_wall, 1),
        "core_stats": stats,
        "stale_acks": (stats or {}).get("stale_acks") if stats is not None else None,
        "stack_stats": extra,
        "worker_events": events,
        "workers_started": len(stack.started),
        "fault_log": [f.to_json() for f in faults],
        "primary_switches": switches,
        "broker_log_tail": broker_log,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
    })  # fmt: skip
    (logdir / "result.json").write_text(json.dumps(figures, indent=1, default=str))
    return figures


def reanalyse(logdir: Path) -> dict[str, Any]:
    """The figures of a finished run again, from its ``result.json`` and ``ledger.json``
    (with this version of the analysis)."""
    figures: dict[str, Any] = json.loads((logdir / "result.json").read_text())
    raw = json.loads((logdir / "ledger.json").read_text())
    published = [Published(**p) for p in raw["published"]]
    executions = [Execution(**e) for e in raw["executions"]]
    faults = [Fault(**f) for f in figures["fault_log"]]
    windows = failover_windows(
        faults, figures.get("primary_switches", []), SENTINEL_DOWN_AFTER_MS / 1000
    )
    figures.update(analyse(published, executions, faults, raw["waiting"], windows))
    return figures


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # the report says why, the run is not lost
        return {"error": repr(exc)}


def _drive(
    cfg: RunConfig,
    stack: Any,
    workers: list[WorkerProc],
    injector: Injector,
    ledger: LedgerReader,
    plan: list[PlannedFault],
    faults: list[Fault],
    events: list[dict[str, Any]],
    progress: bool,
) -> dict[str, Any]:
    todo = workload(cfg)
    published: list[Published] = []
    pending = list(plan)
    t0 = time.time()
    next_note = t0
    skipped: list[str] = []

    def housekeeping() -> None:
        injector.thaw_due()
        for i, w in enumerate(workers):
            if w.proc.poll() is not None:
                expected = any(
                    w.name in f.workers for f in faults if f.kind in ("kill-main", "kill-many")
                )
                if not expected:
                    events.append({"t": time.time(), "worker": w.name, "exit": w.proc.returncode,
                                   "log_tail": w.text()[-6000:]})  # fmt: skip
                    log.warning("%s exited by itself (%s)", w.name, w.proc.returncode)
                workers[i] = stack.start_worker()

    # Fault phase: publish on schedule, inject on schedule, replace what died.
    while time.time() - t0 < cfg.duration_s or todo:
        now = time.time() - t0
        while todo and todo[0][0] <= now:
            _at, p = todo.pop(0)
            _publish(stack, p)
            published.append(p)
        while pending and pending[0].at <= now:
            last_try = now > pending[0].at + FAULT_PATIENCE_S
            f = injector.inject(pending[0], workers, last_try)
            if f is None and not last_try:
                break  # no target yet (no child runs a task): try again next tick
            planned = pending.pop(0)
            if f is None:
                skipped.append(planned.kind)
            else:
                faults.append(f)
                log.info("%6.1fs %s %s pids=%s in_flight=%d verified=%s", now, f.kind,
                         f.workers, f.signalled or "-", len(f.in_flight), f.verified)  # fmt: skip
        housekeeping()
        if progress and time.time() >= next_note:
            log.info(
                "%6.1fs published %d completed %d faults %d workers started %d",
                now,
                len(published),
                ledger.completed_count(),
                len(faults),
                len(stack.started),
            )
            next_note = time.time() + 15
        time.sleep(0.02)

    # Drain: no more faults; wait until every task completed (or the deadline / a stall).
    injector.thaw_due(force=True)
    t_drain = time.time()
    last, last_change = -1, time.time()
    while True:
        housekeeping()
        done = ledger.completed_count()
        if done != last:
            last, last_change = done, time.time()
        if done >= len(published):
            break
        now = time.time()
        if now - t_drain > cfg.drain_timeout_s or now - last_change > cfg.drain_stall_s:
            break
        if progress and time.time() >= next_note:
            log.info(
                "drain %5.1fs: completed %d of %d", time.time() - t_drain, done, len(published)
            )
            next_note = time.time() + 15
        time.sleep(0.25)
    # Let stragglers (duplicates in progress) finish before counting.
    time.sleep(min(cfg.lease_s * 2 + 2, 15))
    return {
        "published": published,
        "fault_phase_s": round(t_drain - t0, 1),
        "drain_s": round(time.time() - t_drain, 1),
        "drained": ledger.completed_count() >= len(published),
        "faults_skipped": len(skipped),
        "faults_skipped_kinds": skipped,
    }


def _publish(stack: Any, p: Published) -> None:
    """Publish, retrying while the broker is unreachable. A retried publish may have gone
    through the first time (the reply was lost), so it is marked for the analysis."""
    p.t = time.time()
    for attempt in range(60):
        try:
            stack.publish(p.task_id, p.seconds, p.delay_s)
            return
        except (redis.RedisError, OSError, OperationalError) as exc:
            p.publish_errors += 1
            log.warning("publish %s failed (%s: %s), retrying", p.task_id, type(exc).__name__, exc)
            time.sleep(min(0.1 * (attempt + 1), 1.0))
    raise RuntimeError(f"could not publish {p.task_id}")


def _stop_all(started: list[WorkerProc], injector: Injector, ledger: LedgerReader) -> None:
    """SIGKILL everything the run started: each worker's tree, then anything the ledger saw
    run that is still alive and is one of ours."""
    import signal

    pids: set[int] = set()
    for w in started:
        if w.proc.poll() is None:
            pids.update(w.tree())
    pids.update(pid for _t, pid in injector.orphans)
    with contextlib.suppress(redis.RedisError):
        pids.update(ex.pid for ex in ledger.running())
    ours = [p for p in pids if procs.alive(p) and _is_worker(p)]
    procs.signal_pids(ours, signal.SIGCONT)
    procs.signal_pids(ours, signal.SIGKILL)
    for w in started:
        try:
            w.proc.wait(10)
        except Exception:
            log.warning("%s did not exit", w.name)


def _is_worker(pid: int) -> bool:
    cmd = procs.cmdline(pid)
    return "celery" in cmd or "rq worker" in cmd or "/rq " in cmd or "dramatiq" in cmd
