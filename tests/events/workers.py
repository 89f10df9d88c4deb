"""Worker subprocesses of the production-event tests: each in its own session, its output
in a log file, killed like a lost node at the end of the test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    for name in ("RQ_QUEUE_CLASS", "RQ_WORKER_CLASS"):
        env.pop(name, None)
    env.update(extra)
    return env


class Proc:
    """A worker subprocess in its own session (a Celery worker and its pool children share
    its process group; RQ's work horses get groups of their own), logging to a file."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill9(self) -> None:
        """kill -9 of the worker and every child of it, as a lost node: all are stopped
        first (SIGSTOP), so none of them acts on another's death, then killed."""
        if self.proc.poll() is None:
            pids = [self.pid, *self.children()]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGSTOP)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            for pid in [*self.children(), *pids]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # the group, its leader gone or not
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
