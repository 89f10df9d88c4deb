"""Long third-party runs (RQ's own suite, the tox matrix subset) started in the background
as soon as pytest knows it will run their tests, one after the other, so that their minutes
overlap the rest of the session without loading the machine twice over. Each test waits for
its run and reads what it printed.

Which test needs which run is :data:`SPECS`; ``tests/conftest.py`` starts the runs the
collected tests need and stops them at the end of the session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Spec:
    """A background run: its name, command, the test that waits for it, the environment
    switch that runs it outside CI, and the tool it cannot run without."""

    name: str
    cmd: list[str]
    test: str
    switch: str
    tool: str

    def wanted(self) -> bool:
        """Whether this session runs it: under CI=true or its switch, with its tool."""
        return (CI or os.environ.get(self.switch) == "1") and shutil.which(self.tool) is not None


#: In the order the runs start.
SPECS = [
    Spec(
        "rq-peer", [sys.executable, "tests/plugins/rq/peer/run_rq_suite.py"],
        "tests/plugins/rq/test_rq_peer_suite.py::test_rq_own_suite_passes_with_belayq_swapped_in",
        "BELAYQ_PEER", "unshare",
    ),
    Spec(
        "matrix", [sys.executable, "-m", "tests.matrix.run_matrix"],
        "tests/matrix/test_matrix.py::test_oldest_and_newest_framework_versions_pass",
        "BELAYQ_MATRIX", "uvx",
    ),
]


@dataclass
class Run:
    """One background command: its output, kept in temporary files, and its exit code."""

    cmd: list[str]
    # Kept open for the run's life, read when it is done.
    out: IO[str] = field(default_factory=lambda: tempfile.TemporaryFile("w+"))  # noqa: SIM115
    err: IO[str] = field(default_factory=lambda: tempfile.TemporaryFile("w+"))  # noqa: SIM115
    proc: subprocess.Popen[str] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False

    def run(self) -> None:
        if not self.cancelled:
            # A session of its own: stopping the run kills everything it started.
            self.proc = subprocess.Popen(
                self.cmd, stdout=self.out, stderr=self.err, text=True, cwd=ROOT,
                start_new_session=True,
            )
            self.proc.wait()
        self.done.set()

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """Wait until the run ended (killing it after ``timeout`` s): code, stdout, stderr."""
        if not self.done.wait(timeout):
            self.stop()
            self.done.wait(30)
        code = self.proc.returncode if self.proc is not None else -1
        self.out.seek(0)
        self.err.seek(0)
        return code if code is not None else -1, self.out.read(), self.err.read()

    def stop(self) -> None:
        self.cancelled = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


_RUNS: dict[str, Run] = {}


def start(names: list[str]) -> None:
    """Start the named runs (of :data:`SPECS`) one after the other, in a thread."""
    commands = {spec.name: spec.cmd for spec in SPECS}
    queued = [_RUNS.setdefault(n, Run(commands[n])) for n in names if n not in _RUNS]

    def serially() -> None:
        for run in queued:
            run.run()

    threading.Thread(target=serially, name="belayq-background-runs", daemon=True).start()


def get(name: str) -> Run:
    """The run ``name``, started now if the session did not start it at collection."""
    if name not in _RUNS:
        start([name])
    return _RUNS[name]


def stop_all() -> None:
    for run in _RUNS.values():
        run.stop()
