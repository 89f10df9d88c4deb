"""Who holds a claim: the host and process of the consumer that made it.

A consumer registers once per queue (and again every :data:`HOLDER_REFRESH_S`), not on every
claim: its record in the queue's ``consumers`` set maps a short tag to its host and pid, and
the token of each of its claims starts with that tag and a dot. The lease records then tell
who holds what with nothing added to the claim script.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .models import text as _text

_TAG: tuple[int, str] | None = None  # (pid, tag): a fork gets a tag of its own

#: This process's registrations: (client id, consumers key) -> when to register again
#: (monotonic s). Shared by the process's queue objects, since the record is the process's.
_DUE: dict[tuple[int, str], float] = {}
os.register_at_fork(after_in_child=_DUE.clear)  # a child is a consumer of its own


def registration_due(client: Any, key: str) -> bool:
    """Whether this process should register (again) in the consumers set ``key``."""
    return time.monotonic() >= _DUE.get((id(client), key), 0.0)


def registered(client: Any, key: str, again_in_s: float) -> None:
    """Note that this process registered in ``key`` (or tried): again in ``again_in_s``."""
    _DUE[(id(client), key)] = time.monotonic() + again_in_s


def unregistered(client: Any, key: str) -> None:
    """Note that this process's record in ``key`` was taken out: the next claim registers."""
    _DUE.pop((id(client), key), None)


def process_tag() -> str:
    """This process's tag: 8 random hex digits, new in a forked child."""
    global _TAG
    pid = os.getpid()
    if _TAG is None or _TAG[0] != pid:
        _TAG = (pid, os.urandom(4).hex())
    return _TAG[1]


def host_name() -> str:
    """This host's name as a consumer record keeps it (no spaces; ``unknown`` if empty)."""
    name = "".join(c for c in socket.gethostname() if c.isprintable() and not c.isspace())
    return name[:255] or "unknown"


def consumer_member() -> str:
    """This process's record in a queue's consumers set: ``"<tag> <host> <pid>"`` (as
    lua/register.lua writes it)."""
    return f"{process_tag()} {host_name()} {os.getpid()}"


def tag_of(token: str) -> str | None:
    """The consumer tag a claim's token starts with; None for a token without one (a claim
    made before consumers registered, or a provisional lease)."""
    tag, dot, _ = token.partition(".")
    return tag if dot and tag else None


@dataclass(frozen=True)
class Holder:
    """A consumer process, as it registered.

    Attributes:
        host: Its host name.
        pid: Its process id.
        registered_ms: When it last registered (ms, server clock).
    """

    host: str
    pid: int
    registered_ms: int


def parse_consumers(rows: Iterable[tuple[Any, float]]) -> dict[str, Holder]:
    """The consumer records of a queue (``ZRANGE consumers 0 -1 WITHSCORES``), by tag."""
    out: dict[str, Holder] = {}
    for member, score in rows:
        parts = _text(member).split(" ")
        if len(parts) == 3 and parts[2].isdigit():
            out[parts[0]] = Holder(parts[1], int(parts[2]), int(score))
    return out
