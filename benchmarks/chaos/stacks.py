"""The stacks under test: how to start a worker, publish a task and read the queue's
counters. Workers are real subprocesses (``celery ... worker -P prefork``, ``rq worker``
with the forking Worker), each in its own session so the harness can find its tree."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from . import procs
from .servers import BrokerSpec

ROOT = Path(__file__).resolve().parents[2]
RQ_BIN = str(Path(sys.executable).with_name("rq"))
STACKS = ("celery-belayq", "rq-belayq", "dramatiq-belayq", "dramatiq-belayq-shards",
          "celery-stock", "rq-stock", "dramatiq-stock")
# RQ's scheduler (for enqueue_in) runs in one worker, under a lock that lives 61 s past
# its holder's death; another worker takes it over at its next maintenance pass (default
# every 600 s), which an idle worker runs only when its blocking dequeue times out
# (worker_ttl - 15 s, default 405 s). Both RQ stacks run with maintenance every 10 s and a
# 40 s worker TTL, so delayed jobs resume within about 61 + 25 s of a scheduler's death.
RQ_MAINTENANCE_S = 10
RQ_WORKER_TTL_S = 40
HARNESS_CLIENT = "chaos-harness"  # client-name prefix of the harness's own connections


@dataclass
class StackConfig:
    """What one stack runs with (the same for every stack of a comparison)."""

    broker: BrokerSpec
    ledger_url: str
    run: str
    logdir: Path
    lease_s: float
    sweep_s: float
    max_deliveries: int
    workers: int
    concurrency: int
    long_task_s: float
    wait_replicas: int = 0
    queue: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:8]}")


class WorkerProc:
    """One worker subprocess (its main process) and its log."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.started = time.time()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[int]:
        """The main process and every descendant (pool children, work horses, scheduler)."""
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(procs.children(pid))
        return out

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Unsupported(Exception):
    """This stack cannot run on this broker topology (or with these options); says why."""


class Stack:
    """Base class: one framework + one transport."""

    name = ""
    framework = ""
    belayq = False
    ready_marker = ""

    def __init__(self, cfg: StackConfig) -> None:
        reason = self.unsupported(cfg)
        if reason:
            raise Unsupported(f"{self.name} on --broker {cfg.broker.kind}: {reason}")
        self.cfg = cfg
        self.started: list[WorkerProc] = []

    @classmethod
    def unsupported(cls, cfg: StackConfig) -> str | None:
        """Why this stack cannot run with ``cfg`` (None: it can)."""
        return None

    @property
    def broker_url(self) -> str:
        return f"redis://127.0.0.1:{self.cfg.broker.port}/0"

    def admin_client(self, name: str, **kwargs: Any) -> Any:
        """A client of the broker (the current primary) named ``chaos-harness-<name>``."""
        return self.cfg.broker.client(f"{HARNESS_CLIENT}-{name}", **kwargs)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env.update(
            PYTHONPATH=os.pathsep.join(paths),
            PYTHONUNBUFFERED="1",
            CHAOS_LEDGER_URL=self.cfg.ledger_url,
            CHAOS_RUN=self.cfg.run,
            CHAOS_QUEUE=self.cfg.queue,
            CHAOS_LEASE_S=str(self.cfg.lease_s),
            CHAOS_LEASE_MS=str(round(self.cfg.lease_s * 1000)),
            CHAOS_SWEEP_S=str(self.cfg.sweep_s),
            CHAOS_SWEEP_MS=str(round(self.cfg.sweep_s * 1000)),
            CHAOS_MAX_DELIVERIES=str(self.cfg.max_deliveries),
            CHAOS_WAIT_REPLICAS=str(self.cfg.wait_replicas),
            CHAOS_MASTER_NAME=self.cfg.broker.service_name,
            CHAOS_SENTINELS=",".join(f"{h}:{p}" for h, p in self.cfg.broker.sentinels),
        )
        for name in ("RQ_QUEUE_CLASS", "RQ_WORKER_CLASS", "PYTEST_CURRENT_TEST"):
            env.pop(name, None)
        return env

    def worker_cmd(self, name: str) -> list[str]:
        raise NotImplementedError

    def start_worker(self) -> WorkerProc:
        n = len(self.started)
        name = f"{self.name}-w{n}-{uuid.uuid4().hex[:6]}"
        w = WorkerProc(name, self.worker_cmd(name), self.env(), self.cfg.logdir / f"{name}.log")
        self.started.append(w)
        return w

    def wait_ready(self, workers: list[WorkerProc], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in workers:
            while self.ready_marker not in w.text():
                if w.proc.poll() is not None:
                    raise RuntimeError(f"{w.name} exited at start:\n{w.text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{w.name} not ready in {timeout} s:\n{w.text()[-3000:]}")
                time.sleep(0.1)

    def publish(self, task_id: str, seconds: float, delay_s: float) -> None:
        raise NotImplementedError

    def core_stats(self) -> dict[str, Any] | None:
        """The belayq core's counters of the queue (None for a stock stack)."""
        return None

    def extra_stats(self) -> dict[str, Any]:
        return {}

    def waiting_ids(self) -> dict[str, list[str]]:
        """Ids the framework still keeps apart at the end (RQ: scheduled, failed)."""
        return {}

    def close(self) -> None:
        pass


def belayq_scheme(kind: str) -> str | None:
    """The ``belayq`` URL scheme for a ``sentinel`` or ``cluster`` broker, if belayq_kombu
    registers one (``belayq+sentinel`` / ``belayq+cluster``); None while it does not."""
    import belayq_kombu

    scheme = f"belayq+{kind}"
    return scheme if scheme in getattr(belayq_kombu, "ALIASES", {}) else None


def kombu_wait_replicas() -> bool:
    """Whether ``belayq://`` takes a ``wait_replicas`` transport option yet."""
    from belayq_kombu import options

    return "wait_replicas" in options.known_options()


class CeleryStack(Stack):
    framework = "celery"
    ready_marker = " ready."

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__(cfg)
        from .celery_app import make_app

        self.app = make_app(
            self.celery_broker, cfg.queue, cfg.lease_s, cfg.sweep_s, cfg.max_deliveries,
            master_name=cfg.broker.service_name, wait_replicas=cfg.wait_replicas,
        )  # fmt: skip
        opts = dict(self.app.conf.broker_transport_options)
        opts["client_name"] = f"{HARNESS_CLIENT}-producer"
        self.app.conf.broker_transport_options = opts

    @property
    def celery_broker(self) -> str:
        b = self.cfg.broker
        if b.kind == "sentinel":
            return ";".join(f"sentinel://{h}:{p}" for h, p in b.sentinels)
        return self.broker_url

    def env(self) -> dict[str, str]:
        return {**super().env(), "CHAOS_BROKER": self.celery_broker}

    def worker_cmd(self, name: str) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "benchmarks.chaos.celery_app", "worker",
            "-P", "prefork", "-c", str(self.cfg.concurrency), "-n", f"{name}@%h",
            "-Q", self.cfg.queue, "-l", "info", "--without-mingle", "--without-gossip",
        ]  # fmt: skip

    def publish(self, task_id: str, seconds: float, delay_s: float) -> None:
        from .celery_app import TASK_NAME

        self.app.send_task(
            TASK_NAME, args=[task_id, seconds], task_id=task_id,
            countdown=delay_s if delay_s > 0 else None,
        )  # fmt: skip

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.app.close()


class CeleryBelayq(CeleryStack):
    name = "celery-belayq"
    belayq = True

    @classmethod
    def unsupported(cls, cfg: StackConfig) -> str | None:
        kind = cfg.broker.kind
        if kind != "single" and belayq_scheme(kind) is None:
            return (
                f"belayq_kombu registers no belayq+{kind}:// URL yet (schemes: "
                f"{_schemes()}); a belayq:// URL of one server would not follow a failover"
            )
        if cfg.wait_replicas and not kombu_wait_replicas():
            return "belayq:// has no wait_replicas transport option yet"
        return None

    @property
    def celery_broker(self) -> str:
        b = self.cfg.broker
        if b.kind == "single":
            return f"belayq://127.0.0.1:{b.port}/0"
        scheme = belayq_scheme(b.kind)
        nodes = b.sentinels if b.kind == "sentinel" else b.cluster_nodes
        return ";".join(f"{scheme}://{h}:{p}" for h, p in nodes)

    def core_stats(self) -> dict[str, Any] | None:
        from kombu.connection import Connection

        from .celery_app import transport_options

        opts = transport_options(
            self.celery_broker, self.cfg.lease_s, self.cfg.sweep_s, self.cfg.max_deliveries,
            master_name=self.cfg.broker.service_name, wait_replicas=self.cfg.wait_replicas,
        )  # fmt: skip
        opts["client_name"] = f"{HARNESS_CLIENT}-stats"
        with Connection(self.celery_broker, transport_options=opts) as conn:  # type: ignore[no-untyped-call]
            return dict(conn.default_channel.queue(self.cfg.queue).stats())


class CeleryStock(CeleryStack):
    name = "celery-stock"

    @classmethod
    def unsupported(cls, cfg: StackConfig) -> str | None:
        if cfg.broker.kind == "cluster":
            return "kombu's Redis transport does not support Redis Cluster"
        if cfg.wait_replicas:
            return "--wait-replicas is a belayq option (the stock transport has none)"
        return None

    def extra_stats(self) -> dict[str, Any]:
        r = self.admin_client("stats")
        try:
            return {"queue_len": r.llen(self.cfg.queue), "unacked": r.hlen("unacked")}
        finally:
            r.close()


def _schemes() -> str:
    import belayq_kombu

    return ", ".join(belayq_kombu.SCHEMES)


#: How long the RQ producer's WAIT after an enqueue waits for the replicas (ms), as
#: belayq's ``wait_timeout_ms`` default.
RQ_WAIT_TIMEOUT_MS = 1000


class RQStack(Stack):
    framework = "rq"
    ready_marker = "Listening on"
    worker_class = "rq.Worker"

    @classmethod
    def unsupported(cls, cfg: StackConfig) -> str | None:
        if cfg.broker.kind == "cluster":
            # Checked with rq 2.12: an enqueue through a RedisCluster client goes through
            # (and belayq_rq's core queue works on it), but the worker does not start.
            return (
                "RQ's Worker needs a client with a connection_pool (Worker._set_connection "
                "reads connection.connection_pool.connection_kwargs), which RedisCluster has "
                "not: `rq worker --connection-class redis.cluster.RedisCluster` exits at start"
            )
        return None

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__(cfg)
        import rq

        # A pool of one connection: the WAIT after an enqueue must run on the connection
        # that wrote it (RQ's pipelines take theirs from the pool).
        self.conn = self.admin_client("producer", max_connections=1)
        self.queue = rq.Queue(cfg.queue, connection=self.conn)

    def worker_cmd(self, name: str) -> list[str]:
        if self.cfg.broker.kind == "sentinel":
            where = ["-c", "benchmarks.chaos.rq_settings"]  # SENTINEL = {...} from the env
        else:
            where = ["-u", self.broker_url]
        return [
            RQ_BIN, "worker", *where, "-w", self.worker_class, "-n", name,
            "--with-scheduler", "--maintenance-interval", str(RQ_MAINTENANCE_S),
            "--worker-ttl", str(RQ_WORKER_TTL_S),
            "--logging_level", "INFO", self.cfg.queue,
        ]  # fmt: skip

    def publish(self, task_id: str, seconds: float, delay_s: float) -> None:
        opts: dict[str, Any] = dict(
            job_id=task_id, result_ttl=600, job_timeout=int(max(180, 4 * self.cfg.long_task_s))
        )
        func = "benchmarks.chaos.rq_jobs.work"
        if delay_s > 0:
            self.queue.enqueue_in(timedelta(seconds=delay_s), func, task_id, seconds, **opts)
        else:
            self.queue.enqueue(func, task_id, seconds, **opts)
        want = self.cfg.wait_replicas
        if want:
            # RQ's enqueue is stock (belayq_rq leaves producers untouched), so the producer
            # waits for the replicas itself; belayq's wait_replicas covers the settles.
            got = int(self.conn.wait(want, RQ_WAIT_TIMEOUT_MS))
            if got < want:
                raise redis.ConnectionError(f"WAIT {want}: {got} replicas have the enqueue")

    def extra_stats(self) -> dict[str, Any]:
        from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

        # ZCARD, not ``.count``: RQ's count runs the registry cleanup, which would fail
        # started jobs of dead workers itself.
        q = self.queue
        return {
            "queue_len": self.conn.llen(q.key),
            "failed": self.conn.zcard(FailedJobRegistry(queue=q).key),
            "started": self.conn.zcard(StartedJobRegistry(queue=q).key),
            "scheduled": self.conn.zcard(ScheduledJobRegistry(queue=q).key),  # type: ignore[no-untyped-call]
        }

    def waiting_ids(self) -> dict[str, list[str]]:
        from rq.registry import FailedJobRegistry, ScheduledJobRegistry

        q = self.queue
        scheduled = ScheduledJobRegistry(queue=q)  # type: ignore[no-untyped-call]
        return {
            "rq_scheduled": _names(self.conn.zrange(scheduled.key, 0, -1)),
            "rq_failed": _names(self.conn.zrange(FailedJobRegistry(queue=q).key, 0, -1)),
        }

    def close(self) -> None:
        self.conn.close()


class RQBelayq(RQStack):
    name = "rq-belayq"
    belayq = True
    worker_class = "benchmarks.chaos.rq_jobs.ChaosWorker"

    def core_stats(self) -> dict[str, Any] | None:
        from .rq_jobs import ChaosQueue

        q = ChaosQueue(
            self.cfg.queue, connection=self.conn, lease_ms=round(self.cfg.lease_s * 1000),
            max_deliveries=self.cfg.max_deliveries,
        )  # fmt: skip
        return dict(q.belayq().stats())


class RQStock(RQStack):
    name = "rq-stock"

    @classmethod
    def unsupported(cls, cfg: StackConfig) -> str | None:
        if cfg.wait_replicas:
            return "--wait-replicas is a belayq option (stock RQ has none)"
        return super().unsupported(cfg)


def _names(items: Any) -> list[str]:
    return [x.decode() if isinstance(x, bytes) else str(x) for x in items]


def _classes() -> dict[str, type[Stack]]:
    from .dramatiq_stacks import DramatiqBelayq, DramatiqBelayqShards, DramatiqStock

    return {
        "celery-belayq": CeleryBelayq,
        "celery-stock": CeleryStock,
        "rq-belayq": RQBelayq,
        "rq-stock": RQStock,
        "dramatiq-belayq": DramatiqBelayq,
        "dramatiq-belayq-shards": DramatiqBelayqShards,
        "dramatiq-stock": DramatiqStock,
    }


def make_stack(name: str, cfg: StackConfig) -> Stack:
    classes = _classes()
    return classes[name](cfg)


def unsupported(name: str, broker: str, wait_replicas: int = 0) -> str | None:
    """Why stack ``name`` cannot run on ``broker`` (a topology) with ``wait_replicas``
    (None: it can), without starting anything."""
    cfg = StackConfig(
        broker=BrokerSpec(broker), ledger_url="", run="", logdir=Path(), lease_s=1, sweep_s=1,
        max_deliveries=1, workers=1, concurrency=1, long_task_s=1, wait_replicas=wait_replicas,
    )  # fmt: skip
    classes = _classes()
    reason = classes[name].unsupported(cfg)
    return None if reason is None else f"{name} on --broker {broker}: {reason}"
