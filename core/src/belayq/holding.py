"""The claims a queue object holds: taken on claim, forgotten on settle, extended by the
keeper's heartbeat while the process lives; and the settlements that could not reach Redis,
which the keeper retries (see :meth:`HeldClaims.retry_later`) and ``close()`` tries once
more (see :meth:`HeldClaims.abandon_unsent`)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from . import rollups
from .config import QueueConfig
from .errors import CLIENT_ERROR, ConfigError, ConnectionLost, DurabilityError
from .forking import fresh_pool_locks
from .keeper import KEEPER
from .keys import QueueKeys
from .models import Delivery, SweepResult
from .models import text as _text
from .observing import Observing, published_ms_of
from .scripts import ScriptRunner
from .sent import Sent

log = logging.getLogger("belayq")
T = TypeVar("T")

#: How often a keeping process writes the per-minute snapshot of a queue's counters (s).
ROLLUP_EVERY_S = 60.0

# Every queue object, so that a forked child gets fresh locks (a keeper thread of the
# parent may hold one at the instant of the fork, and the child would block forever on its
# first settle) and holds nothing: the parent's claims are the parent's, and a child that
# kept them would extend them after the parent died.
FORKABLE: weakref.WeakSet[HeldClaims] = weakref.WeakSet()


def _shallow_copy(obj: T, **changes: Any) -> T:
    """A copy of ``obj`` that shares its attributes' values, but for ``changes``."""
    twin: T = object.__new__(type(obj))
    vars(twin).update(vars(obj), **changes)
    return twin


def _relock_after_fork() -> None:
    for q in list(FORKABLE):
        fresh_pool_locks(q.client)
        q._lock = threading.Lock()
        q._retrying = threading.Lock()
        q._held = {}
        q._starting = set()
        q._sent = []  # the parent's connections: their replies are the parent's to read
        q._unsettled = []
        q._observed.reset()
        q._holding_since_beat = False


os.register_at_fork(after_in_child=_relock_after_fork)


class HeldClaims(Observing):
    """Bookkeeping of unsettled claims, mixed into :class:`~belayq.ReliableQueue`."""

    name: str
    #: The logical queue's name when this queue is one shard of a ShardedQueue.
    sharded_as: str | None = None
    client: Any
    keys: QueueKeys
    config: QueueConfig
    _held: dict[str, Delivery]
    _starting: set[str]
    _sent: list[tuple[Sent, list[Delivery], set[str]]]
    _unsettled: list[tuple[str, Delivery, str]]
    _lock: threading.Lock
    _retrying: threading.Lock
    _use_keeper: bool
    _scripts: ScriptRunner

    #: The settlements :meth:`retry_later` accepts.
    SETTLES = ("ack", "nack", "dead", "release", "defer")

    def _extend(self, deliveries: Sequence[Delivery], *, count_stale: bool) -> list[bool]:
        raise NotImplementedError

    def collect_starts(self) -> None:
        raise NotImplementedError

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[bool]:
        raise NotImplementedError

    def nack(self, delivery: Delivery, *, delay_ms: int | None = 0, reason: str = "") -> str:
        raise NotImplementedError

    def dead_letter(self, delivery: Delivery, reason: str, *, runs_before: int = 0,
                    payload: bytes | None = None) -> bool:
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
        now = time.time()
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
                claimed_s=now,
            )
            for i in range(0, len(flat), 5)
        ]
        if not c.payload_in_list:  # ids the core chose carry their publish time
            for d in got:
                if d.deliveries == 1:
                    self.first_claimed(d, published_ms_of(d.id))
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
        """Whether this object still holds the claim (its token: a re-sent claim's reply
        may hand out another Delivery object of the same claim), as :meth:`_forget` asks."""
        with self._lock:
            held = self._held.get(delivery.id)
        return held is delivery or (held is not None and held.token == delivery.token)

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

    def _retry_guard(self) -> threading.Lock:
        """The lock one pass over the waiting settlements holds (the keeper's beat, a
        caller's :meth:`retry_unsettled` and ``close()`` may overlap), made on first use."""
        with self._lock:
            guard: threading.Lock | None = self.__dict__.get("_retrying")
            if guard is None:
                guard = self._retrying = threading.Lock()
        return guard

    def retry_unsettled(self) -> int:
        """Try the settlements :meth:`retry_later` keeps, in order; stop at the first that
        still cannot reach Redis. Returns how many are left (the keeper calls this).

        A retried settlement does not wait for replicas (``wait_replicas``): whoever settled
        has moved on, so no one could act on a ``DurabilityError``, and the write reaches
        the replicas all the same; the wait would only hold up the lease keeper's beat,
        and so the next extend of every lease the process holds."""
        with self._retry_guard():
            return self._retry_pass()

    def _retry_pass(self) -> int:
        with self._lock:
            pending, self._unsettled = self._unsettled, []
        settler = self._without_replica_waits() if pending else self
        for i, (op, d, reason) in enumerate(pending):
            try:
                ok = settler._settle_one(op, d, reason)
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

    def _without_replica_waits(self) -> HeldClaims:
        """This queue object, but settling without waiting for replicas: a shallow copy,
        so it shares the held claims and their lock, with a script runner of its own that
        has no wait command (the settle methods take the wait from the runner)."""
        if self._scripts.wait_command is None:
            return self
        return _shallow_copy(self, _scripts=_shallow_copy(self._scripts, wait_command=None))

    def abandon_unsent(self) -> list[tuple[str, Delivery]]:
        """Try the waiting settlements once more, then no longer hold the claims of those that
        still cannot be sent, each left to its lease with a warning (``close()`` does this
        before it releases anything). No Redis call when nothing waits.

        Such a claim is not released: a release hands the message back as a delivery that
        never ran, so a finished message would run again, and a nacked or dead-lettered one
        would lose the count of its failed run (a poison message could escape
        ``max_deliveries``). Nor is it kept: nothing would extend its lease after
        ``close()``, and a settle retried after the lease ran out is refused. When its lease
        runs out, the sweep puts the message back as a run that counted.

        Returns:
            ``(op, delivery)`` of each settlement given up.
        """
        with self._retry_guard():
            if self._unsettled:
                try:
                    self._retry_pass()
                except Exception as exc:  # what is left below is left to its lease
                    log.warning("retrying the settlements of %s before closing: %s",
                                self.name, exc)
            with self._lock:
                left, self._unsettled = self._unsettled, []
                for _, d, _ in left:
                    if d.id in self._held and self._held[d.id].token == d.token:
                        del self._held[d.id]
                        self._starting.discard(d.id)
        for op, d, _ in left:
            log.warning(
                "could not %s %s of %s before closing (Redis unreachable): left to its "
                "lease; the message will be delivered again when it runs out", op, d.id,
                self.name,
            )
        return [(op, d) for op, d, _ in left]

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

    def _drop_lost(self, deliveries: Sequence[Delivery], extended: Sequence[Any]) -> None:
        """Forget the claims an extend found no longer held: settled by another process
        (an RQ work horse acks the claim its parent holds), or lost (swept, or claimed
        again), which is worth a warning."""
        refused = [d for d, ok in zip(deliveries, extended, strict=True)
                   if not int(ok) and self._still_held(d)]
        if not refused:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for d in refused:
                    pipe.hexists(self.keys.meta, d.id)
                waiting = pipe.execute()
        except CLIENT_ERROR:  # unknown: say the worse
            waiting = [True] * len(refused)
        for d, lost in zip(refused, waiting, strict=True):
            if lost:
                log.warning("lease of %s on %s was lost; it will be redelivered", d.id, self.name)
            else:
                log.debug("claim of %s on %s was settled by another process", d.id, self.name)
        self._forget(refused)

    def heartbeat(self) -> None:
        """Extend every held lease (reporting the starts since the last beat), then retry
        the settlements that could not reach Redis, then run the sweep (the keeper calls
        this). The beat waits on nothing but Redis's answers to those calls: no extend and
        no retried settle waits for replicas, and no sentinel is asked (a Sentinel-managed
        client's primary is looked up off the beat, see :mod:`belayq.primary`)."""
        self.collect_starts()
        held = self.held
        if held:
            # A claim settled while this runs is refused here without counting as stale.
            self._drop_lost(held, self._extend(held, count_stale=False))
        if self._unsettled:
            self.retry_unsettled()
        self._note_holding()
        self.flush_observations()
        self.sweep()
        now = time.monotonic()
        if now >= getattr(self, "_rolled_at", 0.0) + ROLLUP_EVERY_S:
            self._rolled_at = now
            self._rolled = rollups.record_minute(self, getattr(self, "_rolled", None))  # type: ignore[arg-type]
