"""The fault schedule (seeded, the same for every stack) and the injector.

Kinds:

* ``kill-main``: SIGKILL of one worker's main process (its pool children / work horse are
  left to themselves, as after an OOM kill of the parent);
* ``kill-child``: SIGKILL of one pool child (Celery) / work horse (RQ), one that runs a task
  when there is one;
* ``kill-many``: SIGKILL of 2-3 whole workers at once (every process of each: node loss);
* ``client-kill``: ``CLIENT KILL`` of every broker connection that is not the harness's own
  (all workers' consumer, heartbeat and lease-keeper connections);
* ``redis-restart``: the broker redis-server stopped (SIGKILL or ``SHUTDOWN NOSAVE``) and
  started again on the same port and directory (AOF, ``appendfsync always``);
* ``freeze``: SIGSTOP of one worker (every process of it) for 1.5 x the lease + 1 s, then
  SIGCONT;
* ``failover`` (``--broker sentinel`` or ``cluster`` only): SIGKILL of the primary (Sentinel)
  or of the master that owns the queue's slot (cluster), then its replica's promotion; the
  killed server is started again as a replica of the new primary.

``redis-restart`` is a fault of the single broker only (the replicated topologies keep
nothing on disk: a restarted primary would come back empty; ``failover`` is their outage).
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from . import procs
from .ledger import LedgerReader
from .servers import Broker
from .stacks import HARNESS_CLIENT, Stack, WorkerProc

#: The single broker's kinds (the default; the published tables' seeded schedules).
KINDS = ("kill-main", "kill-child", "kill-many", "client-kill", "redis-restart", "freeze")
ALL_KINDS = (*KINDS, "failover")
#: The default kinds of the replicated topologies: failover in place of redis-restart.
REPLICATED_KINDS = ("kill-main", "kill-child", "kill-many", "client-kill", "freeze", "failover")
KILLS = ("kill-main", "kill-child", "kill-many")
WEIGHTS = {"kill-main": 3, "kill-child": 3, "kill-many": 1, "client-kill": 2,
           "redis-restart": 1, "freeze": 2, "failover": 2}  # fmt: skip
GLOBAL = ("client-kill", "redis-restart", "failover")  # faults that hit every worker


def default_kinds(broker: str) -> tuple[str, ...]:
    return KINDS if broker == "single" else REPLICATED_KINDS


def check_kinds(kinds: Sequence[str], broker: str) -> None:
    """Refuse kinds the broker topology cannot have.

    Raises:
        ValueError: Naming the kind and what to use instead.
    """
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(ALL_KINDS)}")
    if broker == "single" and "failover" in kinds:
        raise ValueError(
            "the failover fault needs replicas: run it with --broker sentinel or --broker "
            "cluster (the single broker has none to promote)"
        )
    if broker != "single" and "redis-restart" in kinds:
        raise ValueError(
            f"redis-restart is a fault of --broker single only: the {broker} broker's servers "
            "keep nothing on disk, so a restarted primary would come back empty; its outage "
            "is the failover fault"
        )


@dataclass
class PlannedFault:
    at: float  # seconds after the workload starts
    kind: str
    pick: float  # which worker(s): an index into the live workers, scaled
    how: str = ""  # redis-restart: sigkill | shutdown-nosave


def make_schedule(
    seed: int, duration_s: float, every_s: float, kinds: Sequence[str] = KINDS
) -> list[PlannedFault]:
    """Faults every ``every_s`` seconds (+-30 % jitter) over ``duration_s``. The first ones
    are one of each kind in a seeded order (so a short run sees every kind); then weighted."""
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(ALL_KINDS)}")
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    weights = {k: w for k, w in WEIGHTS.items() if k in kinds}
    out: list[PlannedFault] = []
    t = every_s
    while t < duration_s:
        if first:
            kind = first.pop(0)
        else:
            kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        how = rng.choice(["sigkill", "shutdown-nosave"])
        out.append(PlannedFault(round(t, 3), kind, rng.random(), how))
        t += every_s * rng.uniform(0.7, 1.3)
    return out


@dataclass
class Fault:
    """What was done, for the report (times are ``time.time()``)."""

    kind: str
    t: float
    t_end: float  # freeze: SIGCONT; otherwise t
    workers: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # every process the fault hit
    signalled: list[int] = field(default_factory=list)
    in_flight: list[list[Any]] = field(default_factory=list)  # [task id, attempt, pid, start]
    verified: bool = False
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Injector:
    """Carries out planned faults against a stack's live workers."""

    def __init__(self, stack: Stack, broker: Broker, ledger: LedgerReader,
                 freeze_s: float) -> None:  # fmt: skip
        self.stack = stack
        self.broker = broker
        self.ledger = ledger
        self.freeze_s = freeze_s
        self.frozen: list[tuple[Fault, list[int]]] = []
        self.orphans: list[tuple[float, int]] = []  # (when, pid) left by kill-main (killed
        # at the end of the run: a Celery pool child whose parent died, RQ's scheduler)

    def in_flight(self, pids: set[int] | None, at: float) -> list[list[Any]]:
        """Executions started and not ended at ``at`` on ``pids`` (None: any live process)."""
        out = []
        for ex in self.ledger.running():
            if ex.start > at:
                continue
            if (pids is None and procs.alive(ex.pid)) or (pids is not None and ex.pid in pids):
                out.append([ex.task_id, ex.attempt, ex.pid, ex.start])
        return out

    def inject(self, plan: PlannedFault, workers: list[WorkerProc], last_try: bool) -> Fault | None:
        """Carry out ``plan`` now, or return None: no target yet (call again, the next tick)
        or, on the ``last_try``, none at all (the fault is skipped)."""
        live = [w for w in workers if w.proc.poll() is None and not self.is_frozen(w)]
        if plan.kind in ("kill-main", "kill-many", "kill-child", "freeze") and not live:
            return None
        if plan.kind == "kill-child":
            return self._kill_child(plan, live, last_try)
        method: Any = getattr(self, "_" + plan.kind.replace("-", "_"))
        fault: Fault | None = method(plan, live)
        return fault

    def is_frozen(self, w: WorkerProc) -> bool:
        return any(w.pid in pids for _f, pids in self.frozen)

    def _kill_main(self, plan: PlannedFault, live: list[WorkerProc]) -> Fault:
        w = live[int(plan.pick * len(live))]
        tree = w.tree()
        t = time.time()
        hit = procs.signal_pids([w.pid], signal.SIGKILL)
        f = Fault("kill-main", t, t, [w.name], tree, hit, self.in_flight(set(tree), t))
        w.proc.wait(10)
        f.verified = w.proc.returncode == -signal.SIGKILL
        self.orphans.extend((t, pid) for pid in tree if pid != w.pid)
        return f

    def _kill_child(
        self, plan: PlannedFault, live: list[WorkerProc], last_try: bool
    ) -> Fault | None:
        # A child that runs a task right now; on the last try any pool child (Celery).
        trees = {w.name: set(w.tree()) - {w.pid} for w in live}
        busy = [(w, ex[2]) for w in live for ex in self.in_flight(trees[w.name], time.time())]
        busy = [(w, pid) for w, pid in busy if procs.alive(pid)]
        if not busy and not last_try:
            return None
        if busy:
            w, pid = busy[int(plan.pick * len(busy))]
        else:
            with_children = [w for w in live if trees[w.name]]
            if not with_children or self.stack.framework == "rq":
                return None  # an idle RQ worker has no horse: skipped
            w = with_children[int(plan.pick * len(with_children))]
            pid = sorted(trees[w.name])[0]
        t = time.time()
        hit = procs.signal_pids([pid], signal.SIGKILL)
        f = Fault("kill-child", t, t, [w.name], [pid], hit, self.in_flight({pid}, t))
        f.verified = _wait_dead([pid], 10)
        f.detail["parent_alive"] = w.proc.poll() is None
        return f

    def _kill_many(self, plan: PlannedFault, live: list[WorkerProc]) -> Fault:
        k = min(len(live), 2 if plan.pick < 0.5 or len(live) < 4 else 3)
        start = int(plan.pick * len(live))
        chosen = [live[(start + i) % len(live)] for i in range(k)]
        trees = [w.tree() for w in chosen]
        pids = [p for tree in trees for p in tree]
        t = time.time()
        hit = procs.signal_pids(pids, signal.SIGKILL)
        f = Fault("kill-many", t, t, [w.name for w in chosen], pids, hit,
                  self.in_flight(set(pids), t))  # fmt: skip
        for w in chosen:
            w.proc.wait(10)
        f.verified = _wait_dead(pids, 10) and len(chosen) >= min(2, len(live))
        return f

    def _client_kill(self, plan: PlannedFault, live: list[WorkerProc]) -> Fault:
        victims: list[dict[str, Any]] = []
        killed = 0
        t = time.time()
        for port in self.broker.data_ports():  # every data server (a worker's replica reads)
            admin = redis.Redis(port=port, client_name=f"{HARNESS_CLIENT}-admin")
            try:
                found = [c for c in admin.client_list() if _worker_client(c)]
                victims += found
                for c in found:
                    with contextlib.suppress(redis.ResponseError):  # it went away by itself
                        killed += int(admin.client_kill_filter(_id=c["id"]))
            except redis.ConnectionError:  # a replica restarting after a failover
                pass
            finally:
                admin.close()
        pids = [p for w in live for p in w.tree()]
        f = Fault("client-kill", t, t, [w.name for w in live], pids, [],
                  self.in_flight(None, t))  # fmt: skip
        names: dict[str, int] = {}
        for c in victims:
            key = str(c.get("name") or "(unnamed)")
            names[key] = names.get(key, 0) + 1
        f.detail = {"killed": killed, "by_name": names}
        f.verified = killed > 0
        return f

    def _redis_restart(self, plan: PlannedFault, live: list[WorkerProc]) -> Fault:
        pids = [p for w in live for p in w.tree()]
        t = time.time()
        in_flight = self.in_flight(None, t)
        detail = self.broker.restart(plan.how or "sigkill")
        f = Fault("redis-restart", t, time.time(), [w.name for w in live], pids, [], in_flight)
        f.detail = detail
        f.verified = bool(detail["verified"])
        return f

    def _failover(self, plan: PlannedFault, live: list[WorkerProc]) -> Fault:
        pids = [p for w in live for p in w.tree()]
        t = time.time()
        in_flight = self.in_flight(None, t)
        detail = self.broker.failover(self.stack.cfg.queue)
        f = Fault("failover", t, time.time(), [w.name for w in live], pids, [], in_flight)
        f.detail = detail
        f.verified = bool(detail.get("verified"))
        return f

    def _freeze(self, plan: PlannedFault, live: list[WorkerProc]) -> Fault:
        w = live[int(plan.pick * len(live))]
        tree = w.tree()
        t = time.time()
        hit = procs.signal_pids(tree, signal.SIGSTOP)
        f = Fault("freeze", t, t + self.freeze_s, [w.name], tree, hit,
                  self.in_flight(set(tree), t))  # fmt: skip
        time.sleep(0.05)
        f.detail["stopped"] = [p for p in tree if procs.state(p) == "T"]
        f.verified = w.pid in f.detail["stopped"]
        self.frozen.append((f, tree))
        return f

    def thaw_due(self, force: bool = False) -> None:
        """SIGCONT the frozen workers whose time is up (all of them with ``force``)."""
        now = time.time()
        keep = []
        for f, pids in self.frozen:
            if force or now >= f.t_end:
                procs.signal_pids(pids, signal.SIGCONT)
                f.t_end = time.time()
                f.detail["continued"] = True
            else:
                keep.append((f, pids))
        self.frozen = keep


def _worker_client(c: dict[str, Any]) -> bool:
    """A connection of a worker (not the harness's own, not a sentinel's, not replication)."""
    name = str(c.get("name") or "")
    flags = str(c.get("flags") or "")
    if name.startswith(HARNESS_CLIENT) or name.startswith("sentinel-"):
        return False
    return "S" not in flags and "M" not in flags


def _wait_dead(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(procs.alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return False
