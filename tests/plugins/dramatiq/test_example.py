"""examples/dramatiq_app.py is a program users run: it must exit 0 and tell the story it
claims."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.plugins.dramatiq.conftest import ROOT


@pytest.mark.timeout(240)
def test_dramatiq_app_walkthrough_exits_0() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "dramatiq_app.py")],
        capture_output=True, text=True, timeout=230, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: every message ran to its end" in out.stdout
    assert "is running again on worker B" in out.stdout
    assert "deliveries 3, runs 3" in out.stdout
    assert "replayed: 3 more runs" in out.stdout
