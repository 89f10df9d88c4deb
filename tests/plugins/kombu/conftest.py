"""Fixtures for the kombu transport: belayq:// URLs on the test redis-server (a valkey-server
for a test on Valkey: ``server_kind``), unique queue names, and real ``celery worker``
subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import belayq_kombu  # noqa: F401  (registers belayq://)
from tests.support import wait_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CELERY = [sys.executable, "-m", "celery"]


@pytest.fixture
def port(request: pytest.FixtureRequest, server_kind: str) -> int:
    """The port of the test server: Redis (``redis_server``), or Valkey 9.1
    (``valkey_server``) for a test on Valkey (``server_kind``)."""
    name = {"redis": "redis_server", "valkey": "valkey_server"}[server_kind]
    return int(request.getfixturevalue(name).port)


@pytest.fixture
def url(port: int) -> str:
    return f"belayq://127.0.0.1:{port}/0"


@pytest.fixture
def stock_url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def kq() -> str:
    """A kombu queue name no other test uses."""
    return f"kq-{uuid.uuid4().hex[:10]}"


class Worker:
    """One ``celery -A worker_app worker`` subprocess with its log file."""

    def __init__(self, env: dict[str, str], log: Path, name: str, args: list[str]) -> None:
        self.name = name
        self.log = log
        self.proc = subprocess.Popen(
            [*CELERY, "-A", "worker_app", "worker", "-n", name, "-l", "info", *args],
            env=env, cwd=HERE, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> Worker:
        wait_for(lambda: " ready." in self.text() or self.proc.poll() is not None,
                 timeout, f"{self.name} to start")
        assert self.proc.poll() is None, self.text()[-3000:]
        return self

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill9(self) -> None:
        """SIGKILL the main process and every pool child (the whole process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill9()  # what is left of its group (a pool child whose main process is gone)


@pytest.fixture
def celery_env(port: int, kq: str, tmp_path: Path) -> dict[str, str]:
    """Environment of the test app: its broker, result backend, queue and record keys."""
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        BQ_BROKER=f"belayq://127.0.0.1:{port}/0",
        BQ_BACKEND=f"redis://127.0.0.1:{port}/1",
        BQ_QUEUE=kq,
        BQ_RECORDS=f"records:{kq}",
    )


@pytest.fixture
def workers(celery_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start workers: ``workers(*args, **env_overrides)``; all stopped after the test."""
    started: list[Worker] = []

    def start(*args: str, **env: str) -> Worker:
        name = f"w{len(started)}-{uuid.uuid4().hex[:6]}@%h"
        w = Worker({**celery_env, **env}, tmp_path / f"worker{len(started)}.log", name, list(args))
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
        if os.environ.get("BQ_SHOW_LOGS"):
            print(w.text())


@pytest.fixture
def records(port: int, kq: str) -> Callable[[], list[dict[str, Any]]]:
    """What the test tasks recorded (start/done events), oldest first."""
    import json

    r = redis.Redis(port=port, db=1)

    def read() -> list[dict[str, Any]]:
        return [json.loads(x) for x in r.lrange(f"records:{kq}", 0, -1)]

    return read
