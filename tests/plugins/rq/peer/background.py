"""RQ's own suite (run_rq_suite.py) started in the background as soon as pytest knows it
will be run, so its 3 minutes overlap the rest of the session (it has its own network
namespace and Redis); ``test_rq_peer_suite`` waits for it and reads its report."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

RUNNER = Path(__file__).with_name("run_rq_suite.py")
ROOT = Path(__file__).resolve().parents[4]


class PeerRun:
    """The runner's process and its captured output."""

    def __init__(self) -> None:
        # Kept open for the run's life, read when it is done.
        self.out: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.err: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(RUNNER)], stdout=self.out, stderr=self.err, text=True,
            cwd=ROOT,
        )

    def wait(self, timeout: float) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.out.seek(0)
        self.err.seek(0)
        return code, self.out.read(), self.err.read()


_RUN: PeerRun | None = None


def start() -> PeerRun:
    """The background run, started on the first call."""
    global _RUN
    if _RUN is None:
        _RUN = PeerRun()
    return _RUN


def stop() -> None:
    if _RUN is not None and _RUN.proc.poll() is None:
        _RUN.proc.kill()
