"""Process helpers for the harness: the process tree from /proc, liveness, signals."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (read from /proc; empty if it is gone)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat[1] == pid:
            found.append(int(entry.name))
    return sorted(found)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[1])


def state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (R, S, T, Z...), or None if it is gone."""
    stat = _stat(pid)
    return None if stat is None else stat[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is dead)."""
    return state(pid) not in (None, "Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def signal_pids(pids: list[int], sig: signal.Signals) -> list[int]:
    """Send ``sig`` to each pid; return those it reached."""
    hit: list[int] = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            hit.append(pid)
    return hit
