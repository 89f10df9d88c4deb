"""Small helpers the queue modules share: error translation, argument checks, decoding."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from .errors import ConfigError, ConnectionLost

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


def check_count(count: int) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"count must be an int >= 1, got {count!r}")


def text(value: Any) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
