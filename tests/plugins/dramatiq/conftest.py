"""Fixtures of the Dramatiq tests: a redis-server flushed before each test (Dramatiq's keys
are global: ``dramatiq:default``), and real ``dramatiq`` worker subprocesses running
``app.py``, killed by process group when the test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from redis.cluster import ClusterNode, RedisCluster

from belayq.embedded import RedisClusterServers, RedisServer
from belayq.keeper import KEEPER
from belayq_dramatiq import Broker
from tests.conftest import flushed_client
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.plugins.dramatiq.app"


@pytest.fixture
def conn(private_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the test's server (Redis; Valkey too for a test marked so: see
    ``server_kind``), flushed first."""
    with flushed_client(private_server) as client:
        yield client


@pytest.fixture
def url(private_server: RedisServer) -> str:
    return f"redis://127.0.0.1:{private_server.port}/0"


class Worker:
    """One ``dramatiq`` command (one worker process) with its log file."""

    def __init__(self, url: str, log: Path, *, stock: bool, threads: int,
                 env: dict[str, str]) -> None:
        self.log = log
        child = dict(os.environ, DQ_URL=url, DQ_STOCK="1" if stock else "0", **env)
        child["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        )
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", APP, "--processes", "1", "--threads",
                 str(threads), "--worker-shutdown-timeout", "5000"],
                env=child, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """kill -9 the command and its worker process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        """Stop it as a deploy does (SIGTERM to the command, which stops its worker
        process); returns its exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(15)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout: float = 60) -> Worker:
        """Wait until its worker process is ready (a loaded box can take a while to boot
        one); fails naming its log."""
        wait_for(lambda: "Worker process is ready for action." in self.output(), timeout,
                 self.output)
        return self


class Workers:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp, self.all = url, tmp, []  # type: ignore[var-annotated]

    def start(self, *, stock: bool = False, threads: int = 2,
              environ: dict[str, str] | None = None, **env: str) -> Worker:
        """Start a worker; ``env`` names are upper-cased (``dq_lease_ms=...``), ``environ``'s
        are passed as they are (Dramatiq's own lower-case ``dramatiq_prom_port``)."""
        w = Worker(self.url, self.tmp / f"worker-{len(self.all)}.log", stock=stock,
                   threads=threads, env={**{k.upper(): v for k, v in env.items()},
                                         **(environ or {})})
        self.all.append(w)
        return w

    def kill_all(self) -> None:
        """kill -9 every worker's whole process group, whether or not its command still
        runs: a worker process left behind (its command killed or stopped first) would go
        on taking the next test's messages from the same server."""
        for w in self.all:
            w.kill()


@pytest.fixture
def workers(url: str, conn: redis.Redis, tmp_path: Path) -> Iterator[Workers]:
    ws = Workers(url, tmp_path)
    try:
        yield ws
    finally:
        ws.kill_all()


@pytest.fixture(params=[pytest.param(False, id="belayq"), pytest.param(True, id="stock")])
def stock(request: pytest.FixtureRequest) -> bool:
    """Each test that asks runs twice: on belayq_dramatiq.Broker and on stock RedisBroker."""
    return bool(request.param)


@pytest.fixture
def producer(url: str, conn: redis.Redis, stock: bool) -> Iterator[dramatiq.Broker]:
    """A producer of the broker ``stock`` picks, with the queue ``default`` declared."""
    b: dramatiq.Broker = RedisBroker(url=url) if stock else Broker(url=url, lease_ms=1000)
    b.declare_queue("default")
    try:
        yield b
    finally:
        b.close()


def entries(conn: redis.Redis, what: str) -> list[tuple[str, int]]:
    """``(key, pid)`` of everything recorded under ``t:<what>``, in order."""
    out = []
    for raw in conn.lrange(f"t:{what}", 0, -1):
        key, pid = raw.decode().split()
        out.append((key, int(pid)))
    return out


def wait_recorded(
    conn: redis.Redis, what: str, count: int, timeout: float
) -> list[tuple[str, int]]:
    """Wait until ``t:<what>`` holds ``count`` entries; returns them."""
    return wait_for(lambda: (e := entries(conn, what)) and len(e) >= count and e, timeout,
                    lambda: f"{count} entries in t:{what}, got {entries(conn, what)}")


@pytest.fixture
def cluster_client(cluster_servers: RedisClusterServers) -> Iterator[RedisCluster]:
    """A client of the session's 3-master cluster, flushed first."""
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in
                                         cluster_servers.startup_nodes])
    client.flushall()
    try:
        yield client
    finally:
        KEEPER.stop_all()
        client.close()
