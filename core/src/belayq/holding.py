"""The claims a queue object holds: taken on claim, forgotten on settle, extended by the
keeper's heartbeat while the process lives; and the settlements that could not reach Redis,
which the keeper retries (see :meth:`HeldClaims.retry_later`)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from . import client_info
from .config import QueueConfig
from .errors import ConfigError, ConnectionLost, DurabilityError
from .keeper import KEEPER
from .models import Delivery, SweepResult
from .models import text as _text

log = logging.getLogger("belayq")

# Every queue object, so that a forked child gets fresh locks (a keeper thread of the
# parent may hold one at the instant of the fork, and the child would block forever on its
# first settle) and holds nothing: the parent's claims are the parent's, and a child that
# kept them would extend them after the parent died.
FORKABLE: weakref.WeakSet[HeldClaims] = weakref.WeakSet()


def _relock_after_fork() -> None:
    for q in list(FORKABLE):
        q._lock = threading.Lock()
        q._held = {}
        q._starting = set()
        q._unsettled = []


os.register_at_fork(after_in_child=_relock_after_fork)


class HeldClaims:
    """Bookkeeping of unsettled claims, mixed into :class:`~belayq.ReliableQueue`."""

    name: str
    #: The logical queue's name when this queue is one shard of a ShardedQueue.
    sharded_as: str | None = None
    client: Any
    config: QueueConfig
    _held: dict[str, Delivery]
    _starting: set[str]
    _unsettled: list[tuple[str, Delivery, str]]
    _lock: threading.Lock
    _use_keeper: bool

    #: The settlements :meth:`retry_later` accepts.
    SETTLES = ("ack", "nack", "dead", "release", "defer")

    def _extend(self, deliveries: Sequence[Delivery], *, count_stale: bool) -> list[bool]:
        raise NotImplementedError

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[bool]:
        raise NotImplementedError

    def nack(self, delivery: Delivery, *, delay_ms: int | None = 0, reason: str = "") -> str:
        raise NotImplementedError

    def dead_letter(self, delivery: Delivery, reason: str) -> bool:
        raise NotImplementedError

    def release(self, deliveries: Sequence[Delivery]) -> int:
        raise NotImplementedError

    def defer(self, deferrals: Sequence[tuple[Delivery, int]]) -> int:
        raise NotImplementedError

    def sweep(self, *, guarded: bool = False) -> SweepResult:
        raise NotImplementedError

    def _take(self, flat: Sequence[Any]) -> list[Delivery]:
        c = self.config
        # Runs before this claim reached max_deliveries: the final hand-over claim.
        ran_before = -1 if c.claim_starts else 0
        final = c.max_deliveries if c.exhausted == "deliver" else None
        got = [
            Delivery(
                id=_text(flat[i]),
                payload=bytes(flat[i + 1]),
                token=_text(flat[i + 2]),
                deliveries=int(flat[i + 3]),
                queue=self.sharded_as or self.name,
                attempts=int(flat[i + 4]),
                exhausted=final is not None and int(flat[i + 4]) + ran_before >= final,
                shard=self.name if self.sharded_as else "",
            )
            for i in range(0, len(flat), 5)
        ]
        if got:
            # Under the lock that close() takes: a claim racing close() on another thread
            # registers the keeper again instead of leaving its claims unkept.
            with self._lock:
                for d in got:
                    self._held[d.id] = d
                if self._use_keeper:
                    KEEPER.register(self)  # type: ignore[arg-type]  # a ReliableQueue
        return got

    def _forget(self, deliveries: Iterable[Delivery]) -> None:
        with self._lock:
            for d in deliveries:
                if self._held.get(d.id) is d or (
                    d.id in self._held and self._held[d.id].token == d.token
                ):
                    del self._held[d.id]
                    self._starting.discard(d.id)

    def forget(self, deliveries: Iterable[Delivery]) -> None:
        """Stop keeping the leases of claims that another process settled (a forked child
        that acked inside its own transaction). No Redis call."""
        self._forget(deliveries)

    @contextlib.contextmanager
    def _settling(self, deliveries: Sequence[Delivery]) -> Iterator[None]:
        # Forget before the script runs, so a heartbeat racing this settle does not try to
        # extend what is being settled; hold them again if the settle never reached Redis
        # (not after DurabilityError: it reached the primary, only unconfirmed).
        self._forget(deliveries)
        try:
            yield
        except DurabilityError:
            raise  # the settle ran on the primary: nothing of it is held any more
        except BaseException:
            with self._lock:
                for d in deliveries:
                    self._held.setdefault(d.id, d)
            raise

    def is_last_run(self, delivery: Delivery) -> bool:
        """Whether this claim's run is the message's last: if it fails (or is lost), the
        message has used up its ``max_deliveries`` runs. The claim's run counts once it
        started (at once with ``claim_starts``)."""
        return delivery.attempts >= self.config.max_deliveries

    def _still_held(self, delivery: Delivery) -> bool:
        with self._lock:
            return self._held.get(delivery.id) is delivery

    @property
    def held(self) -> list[Delivery]:
        """The claims this object holds and has not settled."""
        with self._lock:
            return list(self._held.values())

    # -- settlements that could not reach Redis ---------------------------------------------

    def retry_later(
        self,
        op: str,
        deliveries: Sequence[Delivery],
        reason: str = "",
        *,
        delays_ms: Sequence[int] | None = None,
    ) -> None:
        """Retry a settlement that could not reach Redis (it raised ``ConnectionLost``)
        until it lands: the claims stay held, so the lease keeper extends them meanwhile,
        and each of its beats tries again (:meth:`retry_unsettled`). If this process dies
        first, the leases run out and the messages are redelivered: nothing is lost.

        Args:
            op: ``"ack"``, ``"nack"`` (back to ready at once, a counted run), ``"dead"``
                (dead-letter with ``reason``), ``"release"`` (back to ready, uncounted) or
                ``"defer"`` (to the delayed set, uncounted, see :meth:`defer`).
            deliveries: The claims.
            reason: The nack's or dead letter's reason.
            delays_ms: For ``"defer"`` only, one per claim: how long it was to wait (ms)
                from this call; a retry that lands later defers it for what is left.

        Raises:
            ConfigError: An unknown ``op``, or ``delays_ms`` that does not fit it.
        """
        if op not in self.SETTLES:
            raise ConfigError(f"op must be one of {self.SETTLES}, got {op!r}")
        if (op == "defer") != (delays_ms is not None):
            raise ConfigError("delays_ms goes with op='defer', and op='defer' needs it")
        texts = [reason] * len(deliveries)
        if delays_ms is not None:
            if len(delays_ms) != len(deliveries) or not all(
                isinstance(ms, int) and not isinstance(ms, bool) and ms >= 0 for ms in delays_ms
            ):
                raise ConfigError(
                    f"delays_ms must be one int >= 0 per claim ({len(deliveries)}), got "
                    f"{list(delays_ms)!r}"
                )
            # A deferral waits in the same list as the other settlements, as text: its due
            # time on this process's monotonic clock (ms), so that a late retry keeps it.
            now_ms = time.monotonic() * 1000
            texts = [repr(now_ms + ms) for ms in delays_ms]
        log.warning("could not %s %d claim(s) of %s (Redis unreachable); will retry", op,
                    len(deliveries), self.name)
        with self._lock:
            for d, text in zip(deliveries, texts, strict=True):
                self._held.setdefault(d.id, d)
                self._unsettled.append((op, d, text))
            if self._use_keeper:
                KEEPER.register(self)  # type: ignore[arg-type]  # a ReliableQueue

    @property
    def unsettled(self) -> int:
        """How many settlements wait for :meth:`retry_unsettled`."""
        return len(self._unsettled)

    def retry_unsettled(self) -> int:
        """Try the settlements :meth:`retry_later` keeps, in order; stop at the first that
        still cannot reach Redis. Returns how many are left (the keeper calls this)."""
        with self._lock:
            pending, self._unsettled = self._unsettled, []
        for i, (op, d, reason) in enumerate(pending):
            try:
                ok = self._settle_one(op, d, reason)
            except ConnectionLost:
                with self._lock:
                    self._unsettled[:0] = pending[i:]
                break
            except DurabilityError as exc:  # it ran on the primary: settled, unconfirmed
                log.warning("%s of %s on %s: %s", op, d.id, self.name, exc)
                continue
            except BaseException:  # refused whole (OOM...): keep it and the rest for later
                with self._lock:
                    self._unsettled[:0] = pending[i:]
                raise
            if not ok:
                log.warning("%s of %s on %s refused after a retry: its lease had expired and "
                            "it was redelivered", op, d.id, self.name)
        return len(self._unsettled)

    def _settle_one(self, op: str, d: Delivery, reason: str) -> bool:
        if op == "ack":
            return self.ack_many([d])[0]
        if op == "nack":
            return self.nack(d, delay_ms=0, reason=reason) != "stale"
        if op == "dead":
            return self.dead_letter(d, reason)
        if op == "defer":
            left_ms = max(0, round(float(reason) - time.monotonic() * 1000))
            return self.defer([(d, left_ms)]) == 1
        return self.release([d]) == 1

    def heartbeat(self) -> None:
        """Retry the settlements that could not reach Redis, extend every held lease
        (reporting the starts since the last beat) and run the sweep (the keeper calls
        this). A Sentinel-managed client first asks where the primary is, so the beats
        follow a failover at once (:func:`~belayq.client_info.follow_primary`)."""
        client_info.follow_primary(self.client)
        if self._unsettled:
            self.retry_unsettled()
        held = self.held
        if held:
            # A claim settled while this runs is refused here without counting as stale.
            try:
                extended = self._extend(held, count_stale=False)
            except DurabilityError as exc:
                # The leases were extended on the primary (no replica confirmed it, e.g.
                # a promoted master that has none yet): the sweep must still run.
                log.warning("lease heartbeat of %s: %s", self.name, exc)
                extended = [True] * len(held)
            for d, ok in zip(held, extended, strict=True):
                if not ok and self._still_held(d):
                    log.warning(
                        "lease of %s on %s was lost; it will be redelivered", d.id, self.name
                    )
                    self._forget([d])
        self.sweep()
