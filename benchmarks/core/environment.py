"""What a benchmark ran on: server, client libraries, belayq's source, CPUs and load."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import redis

import belayq


def source_state() -> str:
    """Where belayq was imported from, and the git state of that checkout's core."""
    src = Path(belayq.__file__).resolve().parent
    try:
        def git(*cmd: str) -> str:
            return subprocess.run(
                ["git", "-C", str(src), *cmd], capture_output=True, text=True, check=True
            ).stdout.strip()

        head = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", "."))
        return f"{src} (git {head}{', core modified' if dirty else ''})"
    except (OSError, subprocess.CalledProcessError):
        return f"{src} (not a git checkout)"


def environment(r: redis.Redis, port: int) -> dict[str, Any]:
    try:
        import hiredis

        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = None
    conn = r.connection_pool.get_connection()
    try:
        protocol = conn.protocol
    finally:
        r.connection_pool.release(conn)
    return {
        "redis_version": r.info("server")["redis_version"],
        "redis_port": port,
        "redis_py": redis.__version__,
        "hiredis": bool(redis.utils.HIREDIS_AVAILABLE),
        "hiredis_version": hiredis_version,
        "resp_protocol": protocol,
        "python": platform.python_version(),
        "belayq": belayq.__version__,
        "belayq_source": source_state(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "loadavg_start": os.getloadavg(),
        "platform": platform.platform(),
    }
