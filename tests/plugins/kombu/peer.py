"""Fetch a framework's source distribution from PyPI at test time, into ``.peer/`` (which git
ignores). Nothing from it is ever copied into this repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PEER = ROOT / ".peer"


def _pip() -> list[str]:
    """A pip to download with: this interpreter's, else one on PATH, else uv's."""
    mine = [sys.executable, "-m", "pip"]
    if subprocess.run([*mine, "--version"], capture_output=True).returncode == 0:
        return mine
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            return [found]
    uv = shutil.which("uv")
    if uv:
        return [uv, "tool", "run", "pip"]
    raise RuntimeError("no pip found to download the source distribution with")


def sdist(project: str, version: str) -> Path:
    """The unpacked sdist directory of ``project==version`` (downloaded once).

    Raises:
        RuntimeError: The download failed (no network, no pip); the message says why.
    """
    target = PEER / f"{project}-{version}"
    if (target / "PKG-INFO").exists():
        return target
    PEER.mkdir(exist_ok=True)
    archive = PEER / f"{project}-{version}.tar.gz"
    if not archive.exists():
        out = subprocess.run(
            [*_pip(), "download", "--no-deps", "--no-binary", ":all:", f"{project}=={version}",
             "-d", str(PEER)],
            capture_output=True, text=True, timeout=300,
        )
        if out.returncode != 0 or not archive.exists():
            raise RuntimeError(f"pip download {project}=={version} failed: {out.stderr[-1000:]}")
    with tarfile.open(archive) as tar:
        tar.extractall(PEER, filter="data")
    return target
