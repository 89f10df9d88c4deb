"""Small helpers the queue modules share: error translation, request ids, decoding."""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from .errors import ConfigError, ConnectionLost
from .scripts import Arg

F = TypeVar("F", bound=Callable[..., Any])


def redis_errors(fn: F) -> F:
    """Translate redis-py's connection errors into :class:`ConnectionLost`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ConnectionLost(f"Redis unreachable during {fn.__name__}: {exc}") from exc

    return wrapper  # type: ignore[return-value]


def fresh_id() -> str:
    """A request id for a call that must not run twice but may be re-sent."""
    return uuid.uuid4().hex


def digest(kind: str, args: Sequence[Arg]) -> str:
    """A request id for a settle call: the same call (a retry) gets the same id."""
    h = hashlib.blake2b(kind.encode(), digest_size=16)
    for a in args:
        h.update(b"\0" + (a if isinstance(a, bytes) else str(a).encode()))
    return h.hexdigest()


def check_count(count: int) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"count must be an int >= 1, got {count!r}")


def text(value: Any) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
