"""Taking a connection out of a redis-py pool, across the redis-py versions belayq supports."""

from __future__ import annotations

from typing import Any


def pool_connection(pool: Any) -> Any:
    """A connection from a redis-py pool (redis-py before 5.3 wants a command name)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("EVALSHA")
