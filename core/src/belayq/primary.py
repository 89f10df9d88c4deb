"""Where a Sentinel-managed client's primary is, found off the lease keeper's beat.

redis-py's Sentinel pool (``Sentinel(...).master_for(name)``) asks the sentinels where the
primary is each time it opens a connection, on the sentinel connections the user built:
with no timeout at all by default (RQ's ``SENTINEL`` settings build them so), a sentinel
that no longer answers blocks the caller for good; with one, redis-py's retries stack up
(about 15 s with ``socket_timeout=1.0``); and a sentinel that answers an error (an ACL's
NOPERM) fails the connection even when another sentinel would have answered.

A :class:`PrimaryWatcher` asks the sentinels on a thread of its own, each on a connection
of its own with hard timeouts (:data:`SENTINEL_TIMEOUT_S`) and no retry, skips a sentinel
that answers anything but a usable primary, and asks the one that answered first the next
time. Every pool it watches asks it instead of the sentinels when the pool opens a
connection (:func:`follow` replaces ``get_master_address`` of the pool's connections,
see there), so a new connection never waits on a sentinel either, and when the primary
moves (a failover) it closes the pool's idle connections and wakes the followers' lease
keepers, which extend on the new primary at once.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import redis

from .models import text as _text

log = logging.getLogger("belayq")

#: Longest wait for one sentinel, to connect and to answer (s); never retried at once.
SENTINEL_TIMEOUT_S = 0.5
#: Least time between two lookups of a watcher's thread (s), however often it is woken.
MIN_LOOKUP_GAP_S = 0.05
#: How long the last answer stands when no watcher thread runs in this process (a forked
#: child, a queue no longer kept), before a new connection asks the sentinels again (s).
TRUSTED_S = 2.0

Address = tuple[str, int]
# The connection keyword arguments a watcher's own sentinel connections must not inherit.
_OWN = ("socket_timeout", "socket_connect_timeout", "retry", "retry_on_timeout",
        "retry_on_error", "protocol")


def _sentinel_pool(client: Any) -> Any:
    """The pool of ``client`` if it is a Sentinel-managed primary's, else None."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not getattr(pool, "is_master", False):
        return None
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None or not hasattr(pool, "service_name"):
        return None
    return pool


def _asked(pool: Any) -> Any:
    """The object a connection of ``pool`` asks for the primary's address: the pool's proxy
    (redis-py 5.0.2+), else the pool itself."""
    return pool.connection_kwargs.get("connection_pool", pool)


def _library(obj: Any) -> ModuleType:
    """The client library ``obj`` (a client, a pool) belongs to: ``redis`` (redis-py) or
    ``valkey`` (valkey-py, whose classes do not mix with redis-py's)."""
    return sys.modules.get(type(obj).__module__.split(".")[0]) or redis


def _part(obj: Any, module: str) -> Any:
    """Module ``module`` (``"retry"``, ``"sentinel"``...) of ``obj``'s client library."""
    return importlib.import_module(f"{_library(obj).__name__}.{module}")


def _master_not_found(pool: Any, message: str) -> Exception:
    """The library's own ``MasterNotFoundError`` (a ConnectionError) for ``pool``."""
    error: type[Exception] = _part(pool, "sentinel").MasterNotFoundError
    return error(message)


def _own_client(user: Any) -> Any:
    """A connection to the sentinel ``user`` reaches, with its credentials and TLS, but with
    hard timeouts and no retry (a client of ``user``'s own library)."""
    upool = user.connection_pool
    kwargs = {k: v for k, v in upool.connection_kwargs.items() if k not in _OWN}
    timeout = upool.connection_kwargs.get("socket_timeout") or SENTINEL_TIMEOUT_S
    timeout = min(float(timeout), SENTINEL_TIMEOUT_S)
    pool = _library(user).ConnectionPool(
        connection_class=upool.connection_class,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=_part(user, "retry").Retry(_part(user, "backoff").NoBackoff(), 0),
        **kwargs,
    )
    return type(user)(connection_pool=pool)


def _state(reply: Any) -> dict[str, str]:
    """``SENTINEL MASTER``'s answer (RESP2 pairs or a RESP3 map) as text."""
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {_text(k): _text(v) for k, v in items}


class PrimaryWatcher:
    """The primary of one service as a set of sentinels names it, looked up off the caller's
    thread. See the module's description.

    Args:
        manager: The ``redis.sentinel.Sentinel`` whose sentinels to ask (their addresses,
            credentials and TLS are used; their timeouts are not).
        service: The name the sentinels know the primary by.
    """

    def __init__(self, manager: Any, service: str) -> None:
        self.service = service
        self.min_other_sentinels = int(getattr(manager, "min_other_sentinels", 0) or 0)
        self.force_ip: str | None = getattr(manager, "_force_master_ip", None)
        self._sentinels: list[Any] = [_own_client(s) for s in manager.sentinels]
        self._pools: weakref.WeakSet[Any] = weakref.WeakSet()
        self._followers: weakref.WeakKeyDictionary[Any, tuple[float, Callable[[], Any]]] = (
            weakref.WeakKeyDictionary()
        )
        self.address: Address | None = None
        self._known_at = float("-inf")
        self._looked_at = float("-inf")
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.lookups = 0

    # -- asking the sentinels ----------------------------------------------------------

    def lookup(self) -> tuple[bool, Address | None]:
        """Ask the sentinels, one at a time, until one names a usable primary (it says it is
        a primary, not down, seen by ``min_other_sentinels`` others). A sentinel that does
        not answer within :data:`SENTINEL_TIMEOUT_S`, or answers anything else, is skipped
        and asked last next time.

        Returns:
            Whether any sentinel answered, and the primary's address (None: none named).
        """
        self.lookups += 1
        answered = False
        with self._lock:
            sentinels = list(self._sentinels)
        for sentinel in sentinels:
            try:
                state = _state(sentinel.execute_command("SENTINEL", "MASTER", self.service))
                flags = set(state["flags"].split(","))
                usable = (
                    "master" in flags
                    and not flags & {"s_down", "o_down"}
                    and int(state.get("num-other-sentinels", 0)) >= self.min_other_sentinels
                )
                address = (self.force_ip or state["ip"], int(state["port"]))
            except Exception as exc:  # any answer at all: a timeout, NOPERM, garbage
                log.debug("sentinel %s gave no primary for %r: %r",
                          sentinel.connection_pool.connection_kwargs.get("port"),
                          self.service, exc)
                self._ask_last(sentinel)
                continue
            answered = True
            if usable:
                self._ask_first(sentinel)
                return True, address
        return answered, None

    def _ask_first(self, sentinel: Any) -> None:
        with self._lock:
            if self._sentinels[0] is not sentinel:
                self._sentinels.remove(sentinel)
                self._sentinels.insert(0, sentinel)

    def _ask_last(self, sentinel: Any) -> None:
        with self._lock:
            if self._sentinels[-1] is not sentinel:
                self._sentinels.remove(sentinel)
                self._sentinels.append(sentinel)

    def _learn(self, answered: bool, address: Address | None) -> None:
        """Keep what a lookup found; when the primary moved, close the idle connections of
        every watched pool and wake the followers."""
        if not answered:
            return  # no sentinel answered: the last address is still the best guess
        with self._lock:
            self.address = address
            self._known_at = time.monotonic()
            pools = list(self._pools)
            wakes = [wake for _, wake in self._followers.values()]
        if address is None:
            return
        moved = [pool for pool in pools if self._note(pool, address)]
        if moved:
            log.info("the primary of %r is now %s:%d", self.service, *address)
            for wake in wakes:
                wake()

    @staticmethod
    def _note(pool: Any, address: Address) -> bool:
        """What redis-py's ``get_master_address`` does with an answer: remember it, and
        close the pool's idle connections when it changed. Returns whether it changed."""
        asked = _asked(pool)
        if asked.master_address == address:
            return False
        had = asked.master_address is not None
        asked.master_address = address
        pool.disconnect(inuse_connections=False)
        return had

    # -- what a watched pool asks ------------------------------------------------------

    def primary_for(self, pool: Any) -> Address:
        """The address a new connection of ``pool`` goes to: the last one the sentinels
        named while this process's watcher thread runs (or for :data:`TRUSTED_S` after),
        else what a lookup finds now (bounded: one try of :data:`SENTINEL_TIMEOUT_S` per
        sentinel). Also wakes the watcher thread: a new connection is often the first sign
        of a failover.

        Raises:
            MasterNotFoundError: No sentinel names a usable primary (a ConnectionError).
        """
        self._wake.set()
        with self._lock:
            address = self.address
            trusted = self._running() or time.monotonic() - self._known_at < TRUSTED_S
        if address is None or not trusted:
            answered, address = self.lookup()
            self._learn(answered, address)
        if address is None:
            raise _master_not_found(
                pool,
                f"No master found for {self.service!r}: no sentinel named a usable primary "
                f"within {SENTINEL_TIMEOUT_S} s each"
            )
        self._note(pool, address)
        return address

    def watch(self, pool: Any) -> None:
        """Make ``pool``'s new connections ask this watcher rather than the sentinels."""
        with self._lock:
            if pool in self._pools:
                return
            self._pools.add(pool)
        ref = weakref.ref(pool)
        gone = _master_not_found(pool, f"the pool of {self.service!r} is gone")

        def get_master_address() -> Address:
            watched = ref()
            if watched is None:  # pragma: no cover - a connection outlives its pool
                raise gone
            return self.primary_for(watched)

        # redis-py's connections call this on every connect (SentinelManagedConnection).
        _asked(pool).get_master_address = get_master_address

    # -- the thread --------------------------------------------------------------------

    def follow(self, follower: Any, period_s: float, wake: Callable[[], Any]) -> None:
        """Look the primary up every ``period_s`` (the shortest of all followers') while
        ``follower`` lives or until :meth:`unfollow`; call ``wake()`` when it moved."""
        with self._lock:
            self._followers[follower] = (period_s, wake)
            if self._running():
                return
            self._thread = threading.Thread(
                target=self._run, name="belayq-primary-watcher", daemon=True
            )
            self._thread.start()

    def unfollow(self, follower: Any) -> None:
        with self._lock:
            self._followers.pop(follower, None)
        self._wake.set()

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._lock:
                periods = [period for period, _ in self._followers.values()]
                if not periods:
                    self._thread = None
                    sentinels = list(self._sentinels)
            if not periods:
                for sentinel in sentinels:  # a later lookup connects again
                    sentinel.connection_pool.disconnect(inuse_connections=False)
                return
            gap = time.monotonic() - self._looked_at
            if gap < MIN_LOOKUP_GAP_S:
                time.sleep(MIN_LOOKUP_GAP_S - gap)
            self._looked_at = time.monotonic()
            try:
                self._learn(*self.lookup())
            except Exception as exc:  # never let the thread die: the pools rely on it
                log.warning("looking up the primary of %r failed: %r", self.service, exc)
            self._wake.wait(min(periods))
            self._wake.clear()

    def _after_fork(self) -> None:
        # The thread stays in the parent; the child keeps the last answer for TRUSTED_S.
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._followers = weakref.WeakKeyDictionary()


_WATCHERS: dict[tuple[Any, ...], PrimaryWatcher] = {}
_FOLLOWED: weakref.WeakKeyDictionary[Any, PrimaryWatcher] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _key(pool: Any) -> tuple[Any, ...]:
    manager = pool.sentinel_manager
    nodes = []
    for s in manager.sentinels:
        kw = s.connection_pool.connection_kwargs
        nodes.append((kw.get("host"), kw.get("port"), kw.get("username"), kw.get("password")))
    return (pool.service_name, tuple(sorted(nodes, key=repr)),
            getattr(manager, "min_other_sentinels", 0), getattr(manager, "_force_master_ip", None))


def watcher_of(client: Any) -> PrimaryWatcher | None:
    """The watcher of ``client``'s Sentinel-managed pool (made on first use); None for a
    client that is not a Sentinel-managed primary's."""
    pool = _sentinel_pool(client)
    if pool is None:
        return None
    with _lock:
        key = _key(pool)
        watcher = _WATCHERS.get(key)
        if watcher is None:
            watcher = _WATCHERS[key] = PrimaryWatcher(pool.sentinel_manager, pool.service_name)
    watcher.watch(pool)
    return watcher


def follow(client: Any, follower: Any, period_s: float, wake: Callable[[], Any]) -> None:
    """Keep ``client``'s primary looked up off ``follower``'s thread (see the module):
    from now on, the connections ``client``'s pool opens go to the primary its
    :class:`PrimaryWatcher` last found, and a move of the primary closes the pool's idle
    connections and calls ``wake()``. Nothing for a client not managed by Sentinel."""
    watcher = watcher_of(client)
    if watcher is None:
        return
    with _lock:
        _FOLLOWED[follower] = watcher
    watcher.follow(follower, period_s, wake)


def unfollow(follower: Any) -> None:
    """End the lookups made for ``follower`` (the pool keeps asking the watcher)."""
    with _lock:
        watcher = _FOLLOWED.pop(follower, None)
    if watcher is not None:
        watcher.unfollow(follower)


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    for watcher in _WATCHERS.values():
        watcher._after_fork()
    _FOLLOWED.clear()


os.register_at_fork(after_in_child=_after_fork)
