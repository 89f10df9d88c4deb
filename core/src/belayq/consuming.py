"""Consuming: :meth:`claim`, :meth:`try_claim`, the BLMOVE an event loop sends, the lease of
what it took, and :meth:`ack_and_claim` of :class:`~belayq.ReliableQueue` (mixed into it)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from .config import QueueConfig
from .config import check_count as _check_count
from .constants import (
    CLAIM_NONCE_BYTES,
    CLUSTER_RETRY_FIRST_PAUSE_S,
    CONSUMERS_KEPT,
    HOLDER_REFRESH_S,
    HOLDER_RETRY_S,
    PAUSED_DUE_MS,
    WAIT_FOREVER_ROUND_S,
)
from .errors import (
    CLIENT_ERROR,
    CONNECTION_ERROR,
    OUT_OF_MEMORY,
    RESPONSE_ERROR,
    BelayqError,
    Errors,
    client_errors,
)
from .errors import redis_errors as _redis_errors
from .holders import host_name, process_tag, registered, registration_due
from .keeper import KEEPER
from .keys import QueueKeys
from .models import Delivery
from .scripts import Arg, ScriptRunner
from .settling import Settling

log = logging.getLogger("belayq")

#: What a consumer's registration may meet: it is then tried again later.
_NOT_REGISTERED: Errors = (*CLIENT_ERROR, BelayqError)

# Error replies a blocked BLMOVE gets when its node stops serving the slot.
_FAILOVER_REPLIES = ("UNBLOCKED", "MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "READONLY")


_REDIRECTED = client_errors("AskError", "TryAgainError", "ClusterError")


def _failover_reply(exc: Exception) -> bool:
    if isinstance(exc, _REDIRECTED):
        return True
    return str(exc).split(" ", 1)[0].upper() in _FAILOVER_REPLIES


class Consuming(Settling):
    """Claiming, mixed into :class:`~belayq.ReliableQueue` (on settling: a claim may ride
    with the acks)."""

    name: str
    client: Any
    config: QueueConfig
    keys: QueueKeys
    _scripts: ScriptRunner
    _use_keeper: bool
    _block_cap_s: float

    #: The last claim found the queue paused: blocking claims wait on its unpaused list
    #: (see :meth:`blmove_command`) until a claim finds it resumed.
    paused_seen: bool = False

    def _claim_args(self, count: int) -> list[Arg]:
        """The claim scripts' arguments; the nonce (ARGV[11]: the consumer's tag, a dot and
        random bits) is also the call's request id."""
        c = self.config
        return [
            c.lease_ms,
            count,
            c.floor_every,
            c.sweep_limit,
            f"{process_tag()}.{os.urandom(CLAIM_NONCE_BYTES).hex()}",
            "1" if c.claim_starts else "0",
        ]

    def _claimed(self, flat: Sequence[Any]) -> list[Delivery]:
        """The deliveries of a claim reply; after one that claimed something, this process
        registers as a consumer of the queue (its host and pid: lua/register.lua) when it
        has not for :data:`HOLDER_REFRESH_S`, so that its leases tell who holds them. A
        claim that got nothing writes nothing, a transient queue keeps no record (it leaves
        no key once its messages are settled), and a registration that fails (a full
        server, an ACL without its commands) is tried again later: claims never wait on
        it."""
        got = self._take(flat)
        if not got or self.config.transient:  # a transient queue leaves nothing behind
            return got
        if registration_due(self.client, self.keys.consumers):
            self._register()
        return got

    def _register(self) -> None:
        """Register this process as a consumer of the queue (lua/register.lua: its record
        scored by the server's clock, which the metrics read); a registration that fails is
        tried again after :data:`HOLDER_RETRY_S`."""
        again_in = HOLDER_REFRESH_S
        try:
            self._scripts.run("register", process_tag(), host_name(), os.getpid(),
                              CONSUMERS_KEPT)
        except _NOT_REGISTERED as exc:
            log.debug("consumer of %s not registered (tried again later): %s", self.name, exc)
            again_in = HOLDER_RETRY_S
        registered(self.client, self.keys.consumers, again_in)

    def _noted(self, due_ms: int) -> int:
        """Note whether a claim reply (its ``next_due_ms``) found the queue paused."""
        self.paused_seen = due_ms == PAUSED_DUE_MS
        return due_ms

    @_redis_errors
    def claim(self, timeout: float | None = 1.0, count: int = 1) -> list[Delivery]:
        """Claim up to ``count`` messages, waiting up to ``timeout`` seconds for the first.

        When work is waiting this is one script (pop + lease per message, no landing). When
        the queue is empty it blocks in BLMOVE ready -> landing zone, then registers the
        lease; if the sweep took the entry back in between, the claim is lost and the wait
        goes on.

        Args:
            timeout: Seconds to wait; 0 = do not wait; None = wait until a message comes.
            count: Most messages to claim (prefetch).

        While the queue is paused this claims nothing: it waits on the queue's unpaused
        list (see :meth:`blmove_command`) and claims as soon as a resume wakes it. A claim
        already blocked when the pause comes takes the next message published, whose lease
        script finds the queue paused and hands it back to the head of the ready list,
        uncounted; the claim then waits on the unpaused list.

        Returns:
            The deliveries, ``[]`` on timeout.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        got, due_ms = self.try_claim(count)
        while not got:
            remaining = WAIT_FOREVER_ROUND_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return []
            wait = min(remaining, self._block_cap_s)
            if due_ms >= 0:
                wait = min(wait, max(due_ms, 1) / 1000)
            entry = self._blmove(wait)  # while paused, on the unpaused list
            if entry is None:
                got, due_ms = self.try_claim(count)
            else:
                got, due_ms = self.lease_claimed(entry, count)
        return got

    def _blmove(self, wait: float) -> Any:
        """The blocking half of :meth:`claim`: an entry, or None when the wait ended empty.

        On a cluster, a BLMOVE blocked on a master that fails over is answered with an
        error (``UNBLOCKED`` after ``CLUSTER FAILOVER``, a dropped connection after a kill)
        or redirected by redis-py (MOVED). That ends the wait as if nothing came: the
        non-blocking claim that follows waits for the slot's new owner (see
        ``cluster_retry_ms``), refreshes the slot map, and the next BLMOVE goes there. The
        BLMOVE moved nothing, or its entry waits in the landing zone for the sweep.

        A full server (maxmemory) refuses BLMOVE at once: that counts as an empty wait of
        up to one sweep period (the scripted claim that follows, which a full server runs,
        takes what waits), never a busy loop.
        """
        try:
            return self.client.execute_command(*self.blmove_command(wait))
        except OUT_OF_MEMORY as exc:
            log.info("blocking claim on %s refused by a full server: %s", self.name, exc)
            time.sleep(min(wait, self.config.sweep_interval_ms / 1000))
            return None
        except (*CONNECTION_ERROR, *RESPONSE_ERROR) as exc:
            if not self._scripts.cluster or (
                isinstance(exc, RESPONSE_ERROR) and not _failover_reply(exc)
            ):
                raise
            log.info("blocking claim on %s ended by a cluster change: %s", self.name, exc)
            time.sleep(CLUSTER_RETRY_FIRST_PAUSE_S)  # never a busy loop on a dead node
            return None

    def try_claim(self, count: int = 1, *, patient: bool = True) -> tuple[list[Delivery], int]:
        """Claim up to ``count`` waiting messages without blocking (one script).

        Args:
            count: Most messages to claim.
            patient: On a cluster, wait up to ``cluster_retry_ms`` while the queue's slot
                migrates or its master fails over. False tries once and raises redis-py's
                error (a consumer of several queues serves the others meanwhile).

        Returns:
            The deliveries and the ms until the next delayed message is due (-1: none; -2:
            the queue is paused: nothing is claimed until it is resumed).

        Raises:
            redis.ConnectionError, redis.TimeoutError: untranslated, unlike the rest of the
                API: the event loops built on this (claim_any, the kombu transport) treat
                them as their own connection errors.
        """
        _check_count(count)
        self._keep()
        args = self._claim_args(count)
        run = self._scripts.run if patient else self._scripts.run_once
        reply = run("claim", *args, request_id=str(args[4]))
        return self._claimed(reply[1:]), self._noted(int(reply[0]))

    def claim_command(
        self, count: int
    ) -> tuple[list[Arg], Callable[[Any], tuple[list[Delivery], int]]]:
        """:meth:`try_claim` as a command an event loop sends on its own connection instead
        of a BLMOVE when work is known to be waiting, and the function that turns its reply
        (an error reply as the exception) into what :meth:`try_claim` returns. A reply
        that never comes leaves its claims to the sweep, after their lease.

        Raises (the function):
            redis.ResponseError: an error reply, untranslated (see :meth:`try_claim`).
        """
        _check_count(count)
        self._keep()
        args = self._claim_args(count)

        def claimed(reply: Any) -> tuple[list[Delivery], int]:
            reply = self._scripts.answer("claim", args, reply)
            return self._claimed(reply[1:]), self._noted(int(reply[0]))

        return self._scripts.command("claim", *args), claimed

    def blmove_command(self, timeout: float) -> tuple[str | float, ...]:
        """The BLMOVE an event loop sends on its own connection when the queue is empty.

        Whatever it returns must be passed to :meth:`lease_claimed`; until then the entry
        sits in the landing zone with no lease, and a sweep returns it if the caller dies.

        When the last claim found the queue paused, the BLMOVE waits on the queue's
        unpaused list instead, moving it onto itself: a resume rings the bell there, which
        wakes every consumer waiting so, and each passes the bell to
        :meth:`lease_claimed`, which claims as usual (or finds the queue paused again).
        """
        if self.paused_seen:
            unpaused = self.keys.unpaused
            return ("BLMOVE", unpaused, unpaused, "LEFT", "RIGHT", max(timeout, 0.001))
        if not self.config.bell and len(self.keys.levels) > 1:
            timeout = min(timeout, self.config.sweep_interval_ms / 1000)  # no bell wakes it
        return (
            "BLMOVE",
            self.keys.ready,
            self.keys.processing,
            self.config.ready_head.upper(),
            "LEFT",
            max(timeout, 0.001),
        )

    def lease_claimed(
        self, entry: bytes, count: int = 1, *, patient: bool = True
    ) -> tuple[list[Delivery], int]:
        """Register the lease of an entry a BLMOVE returned, and claim up to ``count - 1``
        more waiting messages in the same script (``patient``: as :meth:`try_claim`).

        Returns:
            As :meth:`try_claim`. The BLMOVE-d entry is missing from the deliveries when the
            sweep took it back first (the claim was lost; another consumer will run it).

        Raises:
            redis.ConnectionError, redis.TimeoutError: as :meth:`try_claim`.
        """
        _check_count(count)
        self._keep()
        args = self._claim_args(count)
        run = self._scripts.run if patient else self._scripts.run_once
        reply = run("lease", *args, entry, request_id=str(args[4]))
        return self._claimed(reply[2:]), self._noted(int(reply[0]))

    def _keep(self) -> None:
        # A consumer sweeps from its first claim on, so lease-less entries of a consumer
        # that died after BLMOVE are adopted even before this one holds anything.
        if self._use_keeper:
            KEEPER.register(self)  # type: ignore[arg-type]  # a ReliableQueue

    # -- settling (see also Settling) -------------------------------------------------

    @_redis_errors
    def ack_and_claim(
        self, deliveries: Sequence[Delivery], count: int
    ) -> tuple[list[bool], list[Delivery]]:
        """Ack claims and claim up to ``count`` waiting messages in one round trip (the ack
        and claim scripts, pipelined): a consumer's steady state with a small prefetch.

        Returns:
            One bool per acked claim, and the new deliveries (``[]`` if none waits).
        """
        _check_count(count)
        if self.config.durable:
            return self.ack_many(deliveries), self.try_claim(count)[0]
        self._keep()
        args = self._claim_args(count)
        with self._settling(deliveries):
            acked, claimed = self._scripts.run_many(
                ("ack", self._ack_args(deliveries), ""),
                ("claim", args, str(args[4])),
            )
        self._noted(int(claimed[0]))
        done = [bool(int(x)) for x in acked]
        self._observe_acked(deliveries, done)
        return done, self._claimed(claimed[1:])

