"""What the ``belayq`` command works on: a Redis URL, never printed with its password (the
queues it acts on are found by :mod:`belayq.discovery`)."""

from __future__ import annotations

import urllib.parse

import redis

#: URL schemes the command takes, and the redis-py scheme each one means.
SCHEMES = {"redis": "redis", "rediss": "rediss", "unix": "unix", "belayq": "redis",
           "belayqs": "rediss"}


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


def kind_filter(kind: str) -> str | None:
    """The ``--kind`` option as a listing filter (``auto``: every kind)."""
    return None if kind == "auto" else kind
