"""examples/rq_app.py is a program users run: it must exit 0 and tell the story it claims."""

from __future__ import annotations

import subprocess
import sys

from tests.plugins.rq.conftest import ROOT, child_env


def test_rq_app_walkthrough_exits_0() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rq_app.py")],
        capture_output=True, text=True, timeout=180, env=child_env(), cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: every job ran to its end" in out.stdout
    assert "is running again on worker B" in out.stdout
    assert "in FailedJobRegistry: True" in out.stdout
