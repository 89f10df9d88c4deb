"""One exception tree for belayq; the client library's errors (redis-py's, or valkey-py's)
are translated at the core's boundary (:func:`redis_errors`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import redis

F = TypeVar("F", bound=Callable[..., Any])

Errors = tuple[type[Exception], ...]

#: The exception modules of the client libraries whose clients belayq accepts: redis-py's,
#: and valkey-py's when it is installed (a fork with exception classes of its own, which an
#: ``except redis.ResponseError`` would miss).
_LIBRARIES: list[ModuleType] = [redis.exceptions]
try:
    import valkey.exceptions as _valkey_exceptions
except ImportError:  # valkey-py is optional
    pass
else:
    _LIBRARIES.append(_valkey_exceptions)

#: redis-py's names that valkey-py spells otherwise.
_VALKEY_NAMES = {"RedisError": "ValkeyError", "RedisClusterException": "ValkeyClusterException"}


def client_errors(*names: str) -> Errors:
    """The exception classes called ``names`` in redis-py and in valkey-py (where
    ``RedisError`` is ``ValkeyError``); a name a library's version lacks is left out."""
    found: list[type[Exception]] = []
    for module in _LIBRARIES:
        for name in names:
            if module is not redis.exceptions:
                name = _VALKEY_NAMES.get(name, name)
            cls = getattr(module, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                found.append(cls)
    return tuple(found)


#: Every error the client raises (``redis.RedisError``).
CLIENT_ERROR = client_errors("RedisError")
#: An error reply of the server (``redis.ResponseError`` and its subclasses below).
RESPONSE_ERROR = client_errors("ResponseError")
#: The server could not be reached, or did not answer in time.
CONNECTION_ERROR = client_errors("ConnectionError", "TimeoutError")
NO_PERMISSION = client_errors("NoPermissionError")
OUT_OF_MEMORY = client_errors("OutOfMemoryError")
READ_ONLY = client_errors("ReadOnlyError")
NO_SCRIPT = client_errors("NoScriptError")
#: A cluster client's own errors: no node serves a slot, a node cannot be connected.
CLUSTER_ERROR = client_errors("RedisClusterException")
#: What a cluster answers while a slot moves or its master fails over.
REDIRECTS = client_errors(
    "TryAgainError", "AskError", "MovedError", "ClusterDownError", "ClusterError"
)

#: What reading INFO of an unknown client may raise.
_INFO_FAILED: Errors = (*CLIENT_ERROR, AttributeError, TypeError)


class BelayqError(Exception):
    """Root of every error belayq raises."""


class ConfigError(BelayqError, ValueError):
    """A queue was configured with a value that cannot work; the message says which and why."""


class UnknownOption(ConfigError, TypeError):
    """An option name nobody reads: a misspelled belayq option. The message names it, the
    closest valid name and every valid one. A ``TypeError`` too, as Python's own error for an
    unexpected keyword argument (see :mod:`belayq.option_names`)."""


class RedisTooOld(BelayqError):
    """The server is older than Redis 6.2, which belayq needs for BLMOVE/LMOVE."""


class SchemaMismatch(BelayqError):
    """The queue's keys were written by a belayq with another key schema version."""


class NotPermitted(ConfigError):
    """The server's ACL refuses a command belayq needs; the message names it and the rule to
    add (docs/acl.md). Nothing was changed by the refused call."""


class OutOfMemory(BelayqError):
    """The server is full (``used_memory`` above ``maxmemory`` under a policy that evicts
    nothing it may) and refused a call that stores more (a publish, a replay) whole: nothing
    was stored. Calls that free memory or keep claims alive still run (ack, nack, extend,
    release, defer, claims, sweep, purge, drop, stats)."""


class CrossSlot(ConfigError):
    """The queue's keys would land on more than one Redis Cluster hash slot."""


class DurabilityError(BelayqError):
    """Fewer replicas (or disks) confirmed a write than ``wait_replicas`` and ``wait_aof`` ask
    for. The write itself happened on the primary; a failover before the replicas catch up
    (or, unconfirmed on the primary's disk, a crash of the primary) may lose it."""


class ConnectionLost(BelayqError, ConnectionError):
    """Redis could not be reached; nothing was changed by the failed call, or the change is
    idempotent and may be retried."""


class BelayqWarning(UserWarning):
    """Root of every warning belayq emits."""


class EvictionRiskWarning(BelayqWarning):
    """The server's ``maxmemory-policy`` may evict keys that have no TTL (``allkeys-*``):
    under memory pressure Redis would silently delete queued, in-flight or dead messages.
    belayq's queue keys never have a TTL, so ``noeviction`` and the ``volatile-*`` policies
    keep them; a full server then refuses writes (OOM) instead."""


#: An error reply of belayq's own scripts (lua/includes/check.lua): its kind and message.
#: Redis 6.2 wraps it ("Error running script (call to f_...): @user_script:N: BELAYQ ..."),
#: Redis 7 and Valkey append where it was raised (" script: ..., on @user_script:N.").
_SCRIPT_ERROR = re.compile(
    r"BELAYQ (bad argument|not permitted): (.*?)(?: script: [^\n]*)?\s*$", re.S
)


#: A full server's refusal (redis-py's OutOfMemoryError; Redis 6.2 wraps it inside a
#: script's error: "... -OOM command not allowed when used memory > 'maxmemory'.").
_OOM = "OOM command not allowed"


def script_error(exc: BaseException) -> BelayqError | None:
    """The belayq error a script's error reply stands for, or None for any other error."""
    if not isinstance(exc, RESPONSE_ERROR):
        return None
    if isinstance(exc, OUT_OF_MEMORY) or _OOM in str(exc):
        return OutOfMemory(f"the Redis server is full and refused the call: {exc}")
    found = _SCRIPT_ERROR.search(str(exc))
    if found is not None:
        kind = NotPermitted if found.group(1) == "not permitted" else ConfigError
        return kind(found.group(2))
    if isinstance(exc, NO_PERMISSION):
        return NotPermitted(f"the server's ACL refuses a command belayq needs (docs/acl.md): {exc}")
    return None


def left_primary(exc: BaseException) -> bool:
    """Whether ``exc`` is a server's answer that it is no longer the primary, after a
    failover demoted it: ``READONLY`` (a write or script sent to a replica: it ran nothing)
    or ``UNBLOCKED`` (a blocked BLMOVE the server ended when its role changed: it moved
    nothing). The call belongs on the new primary; a new connection finds it (a Sentinel
    -managed client asks the sentinels; a virtual IP or DNS name has moved)."""
    if isinstance(exc, READ_ONLY):
        return True
    return isinstance(exc, RESPONSE_ERROR) and str(exc).startswith("UNBLOCKED")


def drop_connections(client: Any) -> None:
    """Close the idle connections of ``client``'s pool (they lead to a demoted server), so
    the next call connects again; the one that got the answer is idle again by now, and
    one in use gets the answer itself. A cluster client re-routes by itself: left alone."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None and hasattr(pool, "disconnect"):
        pool.disconnect(inuse_connections=False)


def _memory_figures(client: Any) -> str:
    """``used_memory``, ``maxmemory`` and ``maxmemory-policy`` as INFO memory gives them now
    (each node's on a cluster), or why they cannot be read."""
    try:
        info = client.info("memory")
    except _INFO_FAILED as exc:
        return f"maxmemory and its policy could not be read: {exc}"
    nodes = info.values() if info and all(isinstance(v, dict) for v in info.values()) else [info]
    return "; ".join(
        f"used_memory {n.get('used_memory', '?')} bytes, maxmemory {n.get('maxmemory', '?')} "
        f"bytes, maxmemory-policy {n.get('maxmemory_policy', '?')}"
        for n in nodes
    )


def out_of_memory(client: Any, call: str, exc: BaseException) -> OutOfMemory:
    """The :class:`OutOfMemory` of ``call`` refused by a full server, with its figures."""
    return OutOfMemory(
        f"the Redis server is full ({_memory_figures(client)}) and refused {call} whole: "
        "nothing was stored. Acks, nacks, extends, releases, claims, sweeps, purges and drops "
        "still run and free memory; raise maxmemory, or drain or purge queues, then retry "
        f"(server reply: {exc})"
    )


def redis_errors(fn: F) -> F:
    """Translate the client library's errors (redis-py's or valkey-py's) at the core's
    boundary: the error replies of belayq's scripts (:func:`script_error`) into their belayq
    errors; connection errors, and a demoted primary's answers (:func:`left_primary`: then
    the connections of the owner's client are dropped), into :class:`ConnectionLost`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CONNECTION_ERROR as exc:
            raise ConnectionLost(f"Redis unreachable during {fn.__name__}: {exc}") from exc
        except RESPONSE_ERROR as exc:
            mapped = script_error(exc)
            if isinstance(mapped, OutOfMemory):
                client = getattr(args[0], "client", None) if args else None
                raise out_of_memory(client, fn.__name__, exc) from exc
            if mapped is not None:
                raise mapped from exc
            if not left_primary(exc):
                raise
            if args:
                drop_connections(getattr(args[0], "client", None))
            raise ConnectionLost(
                f"the server left the primary role during {fn.__name__} (a failover): {exc}"
            ) from exc

    return wrapper  # type: ignore[return-value]
