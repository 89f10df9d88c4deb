"""examples/celery_app.py is a program users run; its crash walkthrough must exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_celery_app_walkthrough_recovers_the_killed_workers_tasks(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "celery_app.py")],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "CELERY_APP_LOGS": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "picked up the dead worker's tasks" in out.stdout
    assert "OK: all 6 tasks completed" in out.stdout
    assert "Retry limit exceeded" not in out.stderr  # nothing reaches for the stopped server
    print(out.stdout)
