"""What a forked child of a consumer process renews before its first command."""

from __future__ import annotations

import threading
from typing import Any


def fresh_pool_locks(client: Any) -> None:
    """Give a forked child fresh locks in ``client``'s connection pool. redis-py's pool
    takes its own lock as it resets itself in a new process (its first command there), but
    keeps the lock object of the parent: when a keeper thread of the parent held it at the
    instant of the fork, the child (an RQ work horse, a prefork child) waits on it forever.
    Only locks the pool has are replaced, so a pool of another shape is left as it is."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return
    for name in ("_lock", "_fork_lock"):
        lock = getattr(pool, name, None)
        if isinstance(lock, _LOCK_TYPES):
            setattr(pool, name, type(lock)())


#: The lock types a pool's locks are renewed as (the same kind as the parent's).
_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
