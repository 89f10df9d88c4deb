"""Fixtures of the RQ tests: a redis-server of their own (RQ's keys are global: rq:workers,
rq:queues, ...; so each test starts from an empty server it owns), clients, and real
``rq worker`` subprocesses that are killed by pid when the test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq.embedded import RedisServer
from tests.conftest import flushed_client

ROOT = Path(__file__).resolve().parents[3]
RQ_BIN = Path(sys.executable).with_name("rq")


@pytest.fixture
def rq_server(private_server: RedisServer) -> RedisServer:
    """The server the RQ tests flush before each test: a redis-server, or a valkey-server
    for a test on Valkey (``server_kind``)."""
    return private_server


@pytest.fixture
def conn(rq_server: RedisServer) -> Iterator[redis.Redis]:
    with flushed_client(rq_server) as client:
        yield client


@pytest.fixture
def rq_url(rq_server: RedisServer) -> str:
    return f"redis://127.0.0.1:{rq_server.port}/0"


def child_env() -> dict[str, str]:
    """The environment of subprocesses: the repo importable (tests.plugins.rq.jobs)."""
    env = dict(os.environ)
    paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("RQ_QUEUE_CLASS", None)
    env.pop("RQ_WORKER_CLASS", None)
    return env


class Workers:
    """Starts ``rq worker`` processes and kills whatever is left of them at the end."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *queues: str, worker_class: str, extra: tuple[str, ...] = ()) -> Any:
        log = self.tmp / f"worker-{len(self.procs)}.log"
        cmd = [
            str(RQ_BIN), "worker", "-u", self.url, "-w", worker_class,
            "--logging_level", "INFO", *extra, *queues,
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                start_new_session=True,
            )
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        # every group, the worker's own gone or not: what is left of it would take the next
        # test's jobs from the same server (horses run in groups of their own)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.log}:\n" + Path(p.log).read_text(errors="replace")[-4000:]  # type: ignore[attr-defined]
            for p in self.procs
        )


@pytest.fixture
def workers(rq_url: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(rq_url, tmp_path)
    yield w
    w.stop_all()


