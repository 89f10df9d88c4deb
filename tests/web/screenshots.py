"""Regenerate the docs' screenshots of the dashboard: ``uv run python -m tests.web.screenshots
docs/img``. It runs the browser tests (a real Chromium on real servers, with Celery's and
RQ's own producers and workers) with ``BELAYQ_SCREENSHOTS`` set to the directory, where each
keeps its screenshots; it exits with the tests' status."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BROWSER_TESTS = ("test_page.py", "test_page_actions.py", "test_page_demo.py",
                 "test_page_dramatiq.py")


def main(argv: list[str]) -> int:
    target = Path(argv[0] if argv else "docs/img").resolve()
    os.environ["BELAYQ_SCREENSHOTS"] = str(target)
    status = pytest.main(["-q", "-p", "no:cacheprovider",
                          *(str(HERE / name) for name in BROWSER_TESTS)])
    print(f"screenshots in {target}: " + ", ".join(sorted(p.name for p in target.glob("*.png"))))
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
