"""The examples are programs users run; each must exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_demo_recovers_the_killed_consumers_message() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo.py")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "came back" in out.stdout and "OK: nothing lost" in out.stdout
