"""What the ``belayq`` command works on: a Redis URL, checked before it is used and never
printed with its password, and the one-line account of what went wrong with its server
(:func:`explain`). The queues it acts on are found by :mod:`belayq.discovery`."""

from __future__ import annotations

import argparse
import os
import re
import urllib.parse

import redis

from ..discovery import Found, find, list_queues, open_found
from ..errors import BelayqError, ConnectionLost, NotPermitted
from ..sharded import AnyQueue

#: URL schemes the command takes, and the redis-py scheme each one means.
SCHEMES = {"redis": "redis", "rediss": "rediss", "unix": "unix", "belayq": "redis",
           "belayqs": "rediss"}

#: Seconds to connect, and to wait for an answer (a URL's own ``socket_connect_timeout``
#: and ``socket_timeout`` win).
CONNECT_TIMEOUT_S = 5
ANSWER_TIMEOUT_S = 10

#: URL options that name a file (TLS certificates and keys): it must exist.
_FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")

#: URL options that hold a secret.
_SECRET_OPTIONS = ("password",)

#: redis-py's connection error text: "Error 111 connecting to host:port. Connection refused."
#: and "Error while reading from host:port : (104, 'Connection reset by peer')".
_CONNECTING = re.compile(r"^Error -?\d+ connecting to .*?\. (.*)$", re.S)
_OS_ERROR = re.compile(r"\(-?\d+, '(.*)'\)\s*$", re.S)
_SSL_WHERE = re.compile(r"\s*\(_ssl\.c:\d+\)")


class CliError(Exception):
    """A one-line error: the command prints it and exits with status 2."""


def redact(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` option) replaced by
    ``***``."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@")
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if any(k in _SECRET_OPTIONS for k, _ in pairs):
            query = "&".join(f"{k}={'***' if k in _SECRET_OPTIONS else v}" for k, v in pairs)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def check_url(url: str) -> tuple[str, str]:
    """The URL's scheme and the URL redis-py reads (Celery's schemes as redis-py's).

    Raises:
        CliError: An unknown scheme, a database that is not a number, or a TLS file that
            does not exist.
    """
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise CliError(f"not a Redis URL: {redact(url)!r} (want redis://, rediss://, unix://, "
                       "belayq:// or belayqs://)")
    parts = urllib.parse.urlsplit(url)
    if scheme != "unix" and not re.fullmatch(r"/?|/\d+/?", parts.path):
        raise CliError(f"the database in {redact(url)!r} must be a number (redis://HOST:PORT/0 "
                       f"is database 0), got {parts.path[1:]!r}")
    for key, value in urllib.parse.parse_qsl(parts.query):
        if key == "db" and not value.isdigit():
            raise CliError(f"the database in {redact(url)!r} must be a number, got {value!r}")
        if key in _FILE_OPTIONS and not os.path.exists(value):
            raise CliError(f"{key} in {redact(url)!r} names no file: {value!r}")
    return scheme, SCHEMES[scheme] + url[len(scheme):]


def connect(url: str) -> redis.Redis:
    """A client of ``url`` (``redis://``, ``rediss://``, ``unix://``, or Celery's
    ``belayq://`` and ``belayqs://``), checked with a PING.

    Raises:
        CliError: A URL that cannot be used (:func:`check_url`), or a server that does not
            answer or refuses (:func:`explain`: one line, the server's reason, the URL
            without its password).
    """
    scheme, target = check_url(url)
    # Long-running commands (watch, exporter, dashboard) sit behind idle-socket killers:
    # keepalives (TCP only) and a PING before reusing an idle connection
    # (docs/managed-redis.md).
    tcp = {"socket_keepalive": True} if scheme != "unix" else {}
    try:
        client = redis.Redis.from_url(target, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                      socket_timeout=ANSWER_TIMEOUT_S,
                                      health_check_interval=30, **tcp)
    except (ValueError, TypeError) as exc:
        raise CliError(f"cannot read the URL {redact(url)!r}: {exc}") from None
    try:
        client.ping()
    except (redis.RedisError, BelayqError, OSError) as exc:
        client.close()
        raise CliError(explain(exc, url)) from None
    return client


def explain(exc: BaseException, url: str) -> str:
    """One line: the URL (without its password), what the server or the network said, and
    what it means when that is not plain."""
    where = redact(url)
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme
    user = parts.username or "default"
    text = str(exc).strip()
    code = getattr(exc, "status_code", None)
    if isinstance(exc, ConnectionLost) and exc.__cause__ is not None:
        exc, text = exc.__cause__, str(exc.__cause__).strip()
    if isinstance(exc, redis.AuthenticationError) or code in ("NOAUTH", "WRONGPASS"):
        if code == "NOAUTH" or (code is None and "required" in text.lower()):
            return (f"{where}: the server asks for a password (NOAUTH {text}): put it in the "
                    "URL, redis://:PASSWORD@HOST:PORT/DB (or USER:PASSWORD@ for an ACL user)")
        return f"{where}: the server refused the login of user {user}: WRONGPASS {text}"
    if isinstance(exc, NotPermitted):
        return f"{where}: NOPERM for user {user}: {text}"
    if isinstance(exc, redis.exceptions.NoPermissionError) or code == "NOPERM":
        return (f"{where}: the server's ACL refuses user {user}: NOPERM {text} (the rules "
                "belayq's commands need: docs/acl.md)")
    if "DB index is out of range" in text:
        return (f"{where}: the server has no database {_db_of(parts)}: {text} (its "
                "`databases` setting; 16 by default, numbered from 0)")
    if isinstance(exc, redis.TimeoutError):
        return _timeout(where, scheme, text)
    if isinstance(exc, redis.ConnectionError):
        return _connection(where, scheme, text)
    if isinstance(exc, redis.exceptions.InvalidResponse):
        return f"{where}: what answered is not a Redis server: {text}"
    if isinstance(exc, redis.ReadOnlyError):
        return f"{where}: this server is a read-only replica: READONLY {text} (use the primary)"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return f"{where}: the server is loading its data: LOADING {text} (try again shortly)"
    if isinstance(exc, redis.ResponseError):
        return f"{where}: the server refused: {f'{code} ' if code else ''}{text}"
    return f"{where}: {text}"


def _db_of(parts: urllib.parse.SplitResult) -> str:
    for key, value in urllib.parse.parse_qsl(parts.query):
        if key == "db":
            return value
    return parts.path.strip("/") or "0"


def _timeout(where: str, scheme: str, text: str) -> str:
    if "connecting" in text.lower() and scheme in ("rediss", "belayqs"):
        hint = "a TLS handshake got no answer: does the server speak TLS on that port?"
    elif "connecting" in text.lower():
        hint = f"no answer within {CONNECT_TIMEOUT_S} s: a wrong host or port, or a firewall?"
    else:
        hint = "connected, but no answer in time: a busy server, or not Redis?"
    return f"{where}: timed out: {text} ({hint})"


def _connection(where: str, scheme: str, text: str) -> str:
    found = _CONNECTING.match(text) or _OS_ERROR.search(text)
    reason = _SSL_WHERE.sub("", found.group(1) if found else text).rstrip(".")
    low = reason.lower()
    tls = scheme in ("rediss", "belayqs")
    hint = ""
    if "refused" in low:
        hint = "is a Redis server listening on that port?"
    elif "name or service not known" in low or "name resolution" in low or "nodename" in low:
        hint = "the host name does not resolve"
    elif "no such file" in low and scheme == "unix":
        hint = "no socket at that path"
    elif "certificate_verify_failed" in low and "hostname" in low:
        hint = "connect with a host name the server's certificate holds"
    elif "certificate_verify_failed" in low:
        hint = "name the CA that signed the server's certificate: ?ssl_ca_certs=/path/ca.pem"
    elif "wrong_version_number" in low or ("ssl" in low and tls):
        hint = "does the server speak TLS on that port? redis:// connects without TLS"
    elif not tls and ("reset" in low or "closed" in low):
        hint = "if the server speaks TLS on that port, use rediss://"
    return f"{where}: cannot connect: {reason}" + (f" ({hint})" if hint else "")


def kind_filter(kind: str) -> str | None:
    """The ``--kind`` option as a listing filter (``auto``: every kind)."""
    return None if kind == "auto" else kind


def found_names(client: redis.Redis, args: argparse.Namespace) -> list[Found]:
    """The queues the command's QUEUE arguments name (each must be known), or, when it
    names none, every queue known (of ``--kind``, in ``--namespace``)."""
    names = getattr(args, "queue", None) or []
    namespace = _namespace(args)
    return ([find(client, n, args.kind, prefix=args.prefix, namespace=namespace)
             for n in names]
            or [f for f in list_queues(client, args.prefix, kind_filter(args.kind))
                if namespace in (None, f.namespace)])


def open_named(client: redis.Redis, args: argparse.Namespace) -> tuple[Found, AnyQueue]:
    """The queue ``args.queue`` of ``args.kind`` as recorded (refused when no registry or
    framework knows it: :class:`~belayq.discovery.NoQueue`), and how it was found."""
    found = find(client, args.queue, args.kind, prefix=args.prefix,
                 namespace=_namespace(args))
    return found, open_found(client, found, prefix=args.prefix)


def _namespace(args: argparse.Namespace) -> str | None:
    """The ``--namespace`` asked for (None: any)."""
    namespace: str | None = getattr(args, "namespace", None)
    return namespace
