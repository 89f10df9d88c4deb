"""What the ``belayq`` command works on: a Redis URL (never printed with its password) and
queues found by name, or listed, whether belayq owns them or adopted Celery's (``belayq://``)
or RQ's (``belayq_rq``) lists."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import redis

from ..keys import kombu_layout, rq_layout, stats_key_kinds
from ..models import text as _text
from ..queue import ReliableQueue

#: URL schemes the command takes, and the redis-py scheme each one means.
SCHEMES = {"redis": "redis", "rediss": "rediss", "unix": "unix", "belayq": "redis",
           "belayqs": "rediss"}
KINDS = ("belayq", "kombu", "rq")


class CliError(Exception):
    """A one-line error: the command prints it and exits with status 2."""


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def connect(url: str) -> redis.Redis:
    """A client of ``url`` (``redis://``, ``rediss://``, ``unix://``, or Celery's
    ``belayq://`` and ``belayqs://``), checked with a PING.

    Raises:
        CliError: An unknown scheme, a URL redis-py cannot read, or a server that does not
            answer (the message never holds the password).
    """
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise CliError(f"not a Redis URL: {redact(url)!r} (want redis://, rediss://, unix://, "
                       "belayq:// or belayqs://)")
    try:
        # Long-running commands (watch, exporter, dashboard) sit behind idle-socket
        # killers: keepalives and a PING before reusing an idle connection
        # (docs/managed-redis.md).
        client = redis.Redis.from_url(SCHEMES[scheme] + url[len(scheme):],
                                      socket_connect_timeout=5, socket_timeout=10,
                                      socket_keepalive=True, health_check_interval=30)
        client.ping()
    except ValueError as exc:
        raise CliError(f"cannot read the URL {redact(url)!r}: {exc}") from None
    except redis.RedisError as exc:
        raise CliError(f"cannot reach {redact(url)}: {type(exc).__name__}") from None
    return client


@dataclass(frozen=True)
class Found:
    """A queue the command found: its kind and name."""

    kind: str
    name: str


def layout(kind: str, name: str, *, prefix: str = "belayq",
           kombu_steps: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The ReliableQueue arguments of queue ``name`` of ``kind``."""
    if kind == "kombu":
        return kombu_layout(name, steps=kombu_steps) if kombu_steps else kombu_layout(name)
    if kind == "rq":
        return rq_layout(name)
    return {"prefix": prefix}


def open_queue(client: redis.Redis, found: Found, *, prefix: str = "belayq",
               lease_ms: int | None = None) -> ReliableQueue:
    """The queue, opened without a lease keeper (the command claims nothing). ``lease_ms``:
    the lease its consumers use (what a lease's age is measured against)."""
    args = layout(found.kind, found.name, prefix=prefix)
    if lease_ms is not None:
        args["lease_ms"] = lease_ms
    return ReliableQueue(client, found.name, keeper=False, **args)


def list_queues(client: redis.Redis, prefix: str = "belayq") -> list[Found]:
    """Every queue whose stats key exists (SCAN: an operator's command, never a hot path),
    by kind then name."""
    found: dict[tuple[str, str], Found] = {}
    for kind, glob, pattern in stats_key_kinds(prefix):
        for key in _scan(client, glob):
            m = re.match(pattern, _text(key))
            if m is None or not client.hexists(key, "schema"):
                continue
            name = m.group(1)
            if kind == "kombu" and name.startswith("rq:queue:"):
                continue  # an RQ queue's stats key matches kombu's pattern too
            found.setdefault((kind, name), Found(kind, name))
    return sorted(found.values(), key=lambda f: (KINDS.index(f.kind), f.name))


def _scan(client: redis.Redis, glob: str) -> list[bytes]:
    try:
        return list(client.scan_iter(match=glob, count=1000))
    except redis.ResponseError as exc:  # renamed away or denied (managed Redis, an ACL)
        raise CliError(
            f"cannot list queues: the server refuses SCAN ({exc}); name the queue instead "
            "(docs/managed-redis.md)"
        ) from None


def resolve(client: redis.Redis, name: str, kind: str = "auto", *,
            prefix: str = "belayq") -> Found:
    """The queue called ``name``: of ``kind``, or the first kind under which it exists (a
    stats key, or a ready list a producer filled).

    Raises:
        CliError: No queue of that name.
    """
    kinds = KINDS if kind == "auto" else (kind,)
    for k in kinds:
        q = open_queue(client, Found(k, name), prefix=prefix)
        if client.exists(q.keys.stats) or any(client.exists(level) for level in q.keys.levels):
            return Found(k, name)
    raise CliError(f"no queue {name!r} ({'any kind' if kind == 'auto' else kind}) on this "
                   "server: `belayq queues` lists them")
