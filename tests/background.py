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
import time
from dataclasses import dataclass
from pathlib import Path

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
        "rq-peer",
        [sys.executable, "tests/plugins/rq/peer/run_rq_suite.py"],
        "tests/plugins/rq/test_rq_peer_suite.py::test_rq_own_suite_passes_with_belayq_swapped_in",
        "BELAYQ_PEER",
        "unshare",
    ),
    Spec(
        "dramatiq-peer",
        [sys.executable, "tests/plugins/dramatiq/peer/run_dramatiq_suite.py", "--all"],
        "tests/plugins/dramatiq/test_dramatiq_peer_suite.py::"
        "test_dramatiq_own_tests_pass_with_belayq_swapped_in",
        "BELAYQ_PEER",
        "unshare",
    ),
    Spec(
        "matrix",
        [sys.executable, "-m", "tests.matrix.run_matrix"],
        "tests/matrix/test_matrix.py::test_oldest_and_newest_framework_versions_pass",
        "BELAYQ_MATRIX",
        "uvx",
    ),
]


#: Set by the session that started the runs (under pytest-xdist: the controller) for the
#: processes that wait for them (the xdist workers): the directory of their output files.
DIR_ENV = "TESTS_BACKGROUND_DIR"


@dataclass
class Run:
    """One background command, started by this process or by the session's controller.

    Its output, exit code and process id are files in a directory shared by the session:
    ``<name>.out``, ``<name>.err``, ``<name>.rc`` (written when it ended) and ``<name>.pid``.
    ``<name>.queued`` says that some process of the session will run it.
    """

    name: str
    cmd: list[str]
    directory: Path
    cancelled: bool = False
    proc: subprocess.Popen[str] | None = None

    def _file(self, suffix: str) -> Path:
        return self.directory / f"{self.name}.{suffix}"

    def queue(self) -> None:
        self._file("queued").touch()

    def run(self) -> None:
        code = -1
        if not self.cancelled:
            with self._file("out").open("w") as out, self._file("err").open("w") as err:
                # A session of its own: stopping the run kills everything it started.
                self.proc = subprocess.Popen(
                    self.cmd,
                    stdout=out,
                    stderr=err,
                    text=True,
                    cwd=ROOT,
                    start_new_session=True,
                )
                self._file("pid").write_text(str(self.proc.pid))
                code = self.proc.wait()
        self._file("rc").write_text(str(code))

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """Wait until the run ended (killing it after ``timeout`` s): code, stdout, stderr."""
        deadline = time.monotonic() + timeout
        rc = self._file("rc")
        while not rc.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not rc.exists():
            self.stop()
            end = time.monotonic() + 30
            while not rc.exists() and time.monotonic() < end:
                time.sleep(0.5)
        code = int(rc.read_text()) if rc.exists() else -1

        def read(suffix: str) -> str:
            f = self._file(suffix)
            return f.read_text() if f.exists() else ""

        return code, read("out"), read("err")

    def stop(self) -> None:
        self.cancelled = True
        pid = self._file("pid")
        if pid.exists() and not self._file("rc").exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid.read_text()), signal.SIGKILL)


_RUNS: dict[str, Run] = {}


def _directory() -> Path:
    if DIR_ENV not in os.environ:
        os.environ[DIR_ENV] = tempfile.mkdtemp(prefix="belayq-background-")
    return Path(os.environ[DIR_ENV])


def start(names: list[str]) -> None:
    """Start the named runs (of :data:`SPECS`) one after the other, in a thread. Processes
    started after this (xdist workers) find them through :data:`DIR_ENV`."""
    commands = {spec.name: spec.cmd for spec in SPECS}
    directory = _directory()
    queued = []
    for n in names:
        if n not in _RUNS and not (directory / f"{n}.queued").exists():
            _RUNS[n] = Run(n, commands[n], directory)
            _RUNS[n].queue()
            queued.append(_RUNS[n])

    def serially() -> None:
        for run in queued:
            run.run()

    threading.Thread(target=serially, name="belayq-background-runs", daemon=True).start()


def get(name: str) -> Run:
    """The run ``name``: this process's, the session's (started by the xdist controller),
    or started now if nobody started it."""
    if name in _RUNS:
        return _RUNS[name]
    directory = Path(os.environ[DIR_ENV]) if DIR_ENV in os.environ else None
    if directory is not None and (directory / f"{name}.queued").exists():
        return Run(name, {s.name: s.cmd for s in SPECS}[name], directory)
    start([name])
    return _RUNS[name]


def stop_all() -> None:
    for run in _RUNS.values():
        run.stop()
