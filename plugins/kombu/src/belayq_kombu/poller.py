"""The I/O side of the transport (kombu plumbing): kombu's poller contract
(``on_poll_start``, ``on_readable``, ``handle_event``, ``get``) over one blocking claim per
consumed queue, plus pub/sub.

Each queue a channel consumes gets a :class:`~.consume.Waiter` holding the core's
:class:`~belayq.blocking.BlockingClaim` on a connection of its own, whose blocking claim is
sent without waiting for the reply; the poller watches the sockets, with Celery's event
loop (the hub) or, without one, with its own ``poll()``. Every decision (whether to claim,
how many, what to do with a reply) is the consume policy's (:mod:`.consume`). Fanout queues
use the stock transport's PSUBSCRIBE connection.

Between the blocking claim and ``lease_claimed`` the entry sits in the core's processing
list, where the sweep finds it if this process dies: no step loses a message.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from queue import Empty
from time import monotonic
from typing import TYPE_CHECKING, Any

import redis
from kombu.utils import eventio

from belayq.sent import pool_connection

from . import options
from .consume import Consume, Step, Waiter
from .kept import check_kept

if TYPE_CHECKING:
    from belayq import ReliableQueue

    from .channel import Channel
    from .tags import Tags

log = logging.getLogger("belayq.kombu")

_eventio: Any = eventio  # kombu's annotations are partial; Any to mypy --strict
READ: int = _eventio.READ
ERR: int = _eventio.ERR

LISTEN = "LISTEN"


class Poller:
    """Shared by the channels of one transport (kombu calls it the transport's cycle)."""

    eventflags = READ | ERR

    #: Set by :meth:`get` while reading; the stock channel defers basic_cancel meanwhile.
    _in_protected_read = False

    def __init__(self, tags: Tags) -> None:
        self._channels: set[Channel] = set()
        self._fds: dict[int, tuple[Channel, Any]] = {}
        self._socks: dict[tuple[Channel, Any], tuple[Any, Any]] = {}
        self.poller: Any = _eventio.poll()
        self.after_read: set[Callable[[], Any]] = set()
        self._remove_fd: Callable[[int], Any] = self._unregister
        self._next_sweep = 0.0
        self._next_adopt = 0.0
        self._trefs: list[Any] = []  # the event loop's timers, cancelled on re-registration
        self.with_hub = False  # registered with an event loop (Celery's hub)
        self.claims = tags  # the transport's delivery tags, whose deferred acks we flush

    def attach_hub(
        self, loop: Any, timers: list[tuple[float, Callable[[], Any]]]
    ) -> None:
        """Run with Celery's event loop ``loop`` from now on: its poller, its fd removal,
        and ``timers`` ((period in s, callback) pairs) on its clock, replacing the timers
        of an earlier registration."""
        self.on_poll_init(loop.poller)
        self.with_hub = True
        self._remove_fd = loop.remove
        for tref in self._trefs:
            tref.cancel()
        self._trefs = [loop.call_repeatedly(period, fun) for period, fun in timers]

    # -- channels and sockets ------------------------------------------------------

    def add(self, channel: Channel) -> None:
        self._channels.add(channel)

    def discard(self, channel: Channel) -> None:
        self._channels.discard(channel)
        for key in [k for k in self._socks if k[0] is channel]:
            self._forget(key)

    def close(self) -> None:
        for key in list(self._socks):
            self._forget(key)
        self._channels.clear()

    @property
    def fds(self) -> dict[int, Channel]:
        return {fd: chan for fd, (chan, _) in self._fds.items()}

    def sockets(self) -> dict[int, Any]:
        """The sockets polled now, by file descriptor."""
        return {fd: self._socks[key][0] for fd, key in self._fds.items() if key in self._socks}

    def _unregister(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(fd)

    def _register(self, channel: Channel, key: Any, conn: Any) -> None:
        sock = conn._sock
        known = self._socks.get((channel, key))
        if known is not None and known[0] is sock:
            return
        if known is not None:
            self._forget((channel, key))
        fd = sock.fileno()
        self._fds[fd] = (channel, key)
        self._socks[(channel, key)] = (sock, conn)
        self.poller.register(sock, self.eventflags)

    def _forget(self, key: tuple[Channel, Any]) -> None:
        known = self._socks.pop(key, None)
        if known is None:
            return
        for fd, value in list(self._fds.items()):
            if value == key:
                del self._fds[fd]
                self._remove_fd(fd)

    def on_connection_disconnect(self, connection: Any) -> None:
        """A connection of ours was closed: stop polling its (now closed) socket."""
        for key, (_, conn) in list(self._socks.items()):
            if conn is connection:
                if isinstance(key[1], Waiter):
                    key[1].lost()
                self._forget(key)

    # -- one poll cycle --------------------------------------------------------------

    def on_poll_init(self, poller: Any) -> None:
        self.poller = poller
        self.maybe_sweep(force=True)
        self.maybe_adopt(force=True)

    def on_poll_start(self) -> bool:
        """For every consumed queue with no claim pending, while credit allows: claim what
        is known to be waiting at once (one script; delivered here), else send a blocking
        claim. Subscribe fanout queues. Returns whether messages were delivered."""
        # With the event loop, the acks are sent and their answers read at the next tick:
        # the loop goes on to the pool's results and the sockets meanwhile.
        self.claims.flush(wait=not self.with_hub)
        delivered = False
        for channel in list(self._channels):
            if channel.active_queues:
                for waiter in channel.waiters():
                    step = channel.consume.step(waiter, with_hub=self.with_hub)
                    if step is not Step.BLOCK:
                        delivered = delivered or step is Step.DELIVERED
                        continue
                    waiter.socket()
                    self._register(channel, waiter, waiter.conn)
                    waiter.send(channel.brpop_timeout, channel.consume.credit())
            if channel.active_fanout_queues:
                self._listen(channel)
        return delivered

    def _listen(self, channel: Channel) -> None:
        client = channel.subclient
        if getattr(client, "connection", None) is None:
            client.connection = pool_connection(client.connection_pool)
        if client.connection._sock is None or (channel, LISTEN) not in self._socks:
            channel._in_listen = False
            if client.connection._sock is None:
                client.connection.connect()
            self._register(channel, LISTEN, client.connection)
        if not channel._in_listen:
            channel._subscribe()

    def on_readable(self, fd: int) -> bool:
        """Handle a readable socket; True when a message was delivered."""
        found = self._fds.get(fd)
        if found is None:
            return False
        channel, key = found
        if key == LISTEN:
            if channel.qos.can_consume():
                return bool(channel._receive())
            return False
        return channel.consume.on_reply(key)

    def handle_event(self, fd: int, event: int) -> tuple[bool, Poller] | None:
        if event & READ:
            return self.on_readable(fd), self
        if event & ERR:
            found = self._fds.get(fd)
            if found is not None:
                channel, key = found
                if key == LISTEN:
                    channel.subclient.parse_response()
                else:
                    key.read()
        return None

    def get(self, callback: Any, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for one batch of messages (no event loop: drain_events)."""
        self._in_protected_read = True
        claims = self.claims
        deferring, claims.defer_thread = claims.defer_thread, threading.get_ident()
        try:
            if self.on_poll_start():
                return
            for fd, event in self.poller.poll(timeout) or ():
                listen = self._fds.get(fd, (None, None))[1] == LISTEN
                handled = self.handle_event(fd, event)
                # Like the stock transport, any pub/sub event ends the wait (a subscribe
                # confirmation too); a claim that timed out does not.
                if handled and (handled[0] or listen):
                    return
            self.maybe_sweep()
            self.maybe_adopt()
            raise Empty()
        finally:
            self._in_protected_read = False
            claims.defer_thread = deferring
            self._flush_and_claim(claims)
            while self.after_read:
                try:
                    fun = self.after_read.pop()
                except KeyError:
                    break
                fun()

    def _flush_and_claim(self, claims: Tags) -> None:
        """Send the acks the callbacks made during :meth:`get`; for a queue whose last claim
        found more waiting, claim the next messages in the same round trip."""
        if not claims.pending:
            return
        more: dict[ReliableQueue, int] = {}
        takers: dict[ReliableQueue, Waiter] = {}
        if not self.with_hub:
            for channel in list(self._channels):
                for waiter in channel.waiters(create=False):
                    credit = channel.consume.with_acks(waiter)
                    if credit > 0 and waiter.rq not in more:
                        more[waiter.rq], takers[waiter.rq] = credit, waiter
        for rq, deliveries in claims.flush(more).items():
            Consume.took_with_acks(takers[rq], deliveries, more[rq])

    # -- upkeep (timers with the hub; piggybacked on empty polls without one) ------------

    def maybe_sweep(self, force: bool = False) -> None:
        """Run the sweep of every consumed queue, at most once per
        ``sweep_interval``; settle the kept claims whose tasks ended."""
        now = monotonic()
        if not force and now < self._next_sweep:
            return
        interval = min((c.sweep_interval for c in self._channels), default=1.0)
        self._next_sweep = now + interval
        self.claims.report_starts()
        for channel in list(self._channels):
            try:
                channel.sweep()
            except (redis.ConnectionError, redis.TimeoutError, ConnectionError):
                log.debug("sweep skipped: Redis unreachable", exc_info=True)
                return
        self.claims.flush()
        check_kept()

    def maybe_adopt(self, force: bool = False) -> None:
        """Requeue what stock workers left in their unacked hash (rolling migration)."""
        now = monotonic()
        if not force and now < self._next_adopt:
            return
        self._next_adopt = now + options.ADOPT_INTERVAL_S
        for channel in list(self._channels):
            if channel.active_queues:
                try:
                    channel.adopt_stock()
                except (redis.ConnectionError, redis.TimeoutError, ConnectionError):
                    log.debug("adoption skipped: Redis unreachable", exc_info=True)
                return

    def maybe_check_health(self) -> None:
        """Drop claim connections whose blocking claim is overdue (a half-open socket), and
        ping the pub/sub connections."""
        now = monotonic()
        for channel in list(self._channels):
            for waiter in channel.waiters(create=False):
                overdue = channel.brpop_timeout + (
                    channel.health_check_interval or options.HEALTH_CHECK_INTERVAL_S)
                if waiter.sent_at is not None and now - waiter.sent_at > overdue and waiter.conn:
                    log.warning("the blocking claim on %s got no reply for %.0f s; reconnecting",
                                waiter.queue, now - waiter.sent_at)
                    waiter.conn.disconnect()
            client = channel.__dict__.get("subclient")
            if client is not None and callable(getattr(client, "check_health", None)):
                try:
                    client.check_health()
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    log.debug("pub/sub health check failed", exc_info=True)
