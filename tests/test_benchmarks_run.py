"""The benchmarks still run against the API they time: each one that can run small runs
here, in a subprocess, at a scale of seconds, and prints its verdict lines. (Their figures
are not judged here: they are measured in full by their commands, see docs/benchmarks.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SMALL = {
    "benchmarks.ops": (["--queues", "3", "--messages", "2000", "--keys", "1000", "--reps", "1"],
                       "target: dashboard queue page answered"),
    "benchmarks.core.otel": (["--n", "200", "--reps", "1"], "| publish + claim + ack |"),
    "benchmarks.dramatiq_bench": (["--n", "200", "--reps", "1"], "drain "),
}


@pytest.mark.parametrize("module", sorted(SMALL))
def test_the_benchmark_runs_small(module: str) -> None:
    args, printed = SMALL[module]
    run = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert printed in run.stdout, run.stdout[-3000:]
