"""The README is a user's first read, and the documentation site builds without a warning."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_first_read() -> None:
    lines = README.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines"
    headings = [line[3:] for line in lines if line.startswith("## ")]
    for wanted in ("Quickstart", "Install", "Adopting it", "Configuration",
                   "Guarantees and limits", "Documentation"):  # fmt: skip
        assert wanted in headings, (wanted, headings)
    # What it is and for whom comes first: before the first command.
    first_screen = README[: README.index("## Quickstart")]
    assert "Celery" in first_screen and "RQ" in first_screen and "```" not in first_screen


def test_the_readmes_links_lead_somewhere() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) > 10
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    # The API page is made from the docstrings: the queue's methods are there.
    api = (site / "api" / "index.html").read_text()
    for name in ("ReliableQueue.claim", "ReliableQueue.ack", "ShardedQueue", "ConfigError"):
        assert f'id="belayq.{name}"' in api or f'id="belayq.errors.{name}"' in api, name
    # The pages the README points to are in the site, and so is the changelog.
    for page in ("getting-started", "celery", "rq", "operations", "guarantees", "changelog"):
        assert (site / page / "index.html").exists(), page
