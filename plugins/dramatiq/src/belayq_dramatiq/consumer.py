"""The consumer: claims through the core with fenced leases, hands Dramatiq
:class:`MessageProxy` objects, and settles them: ``ack`` acks, ``nack`` dead-letters with
the reason, ``requeue`` hands unstarted claims back uncounted.

A claim's run is counted when Dramatiq starts it (the broker's :class:`StartReports`
middleware, on ``before_process_message``), so the messages a worker prefetched but never
started come back uncounted when it dies; the process's lease keeper extends every lease
it holds until the message is settled.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING, Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.common import current_millis, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware

from belayq import ConnectionLost, Delivery, ReliableQueue
from belayq.observing import published_ms_of

if TYPE_CHECKING:
    from .broker import Broker
    from .store import Store

log = logging.getLogger("belayq_dramatiq")

#: Most messages one pass takes from a stock list.
MOVE_BATCH = 100


class Proxy(MessageProxy):
    """A Dramatiq message proxy that carries its claim, and the runs its message had under
    earlier ids (each ``Retries`` retry is a new message: ``retries`` when it was sent)."""

    def __init__(self, message: dramatiq.Message[Any], delivery: Delivery) -> None:
        super().__init__(message)
        self.belayq_delivery = delivery
        retries = message.options.get("retries", 0)
        self.belayq_runs_before = retries if isinstance(retries, int) and retries > 0 else 0


def dead_letter_body(message: MessageProxy) -> bytes | None:
    """The body a message that ``Retries`` retried keeps as a dead letter: its retry count
    back to 0, so a replay gets every retry again (None: nothing to reset)."""
    if "retries" not in message.options:
        return None
    original: dramatiq.Message[Any] = message._message
    return original.copy(options={"retries": 0}).encode()


def reason_of(message: MessageProxy, actors: Container[str]) -> str:
    """Why a failed message is dead-lettered: its exception, or what failed it.

    Args:
        message: The failed message.
        actors: The names of the actors the broker knows.
    """
    exc = getattr(message, "_exception", None)
    if exc is None and message.actor_name not in actors:
        # Dramatiq 1.x fails a message of an unknown actor without its ActorNotFound, which
        # 2.x attaches; the reason reads the same on both.
        return f"ActorNotFound: {message.actor_name}"
    if exc is None:
        return "failed by Dramatiq (message.fail(), e.g. AgeLimit)"
    return f"{type(exc).__name__}: {exc}"


def sent_ms(message: dramatiq.Message[Any]) -> float | None:
    """When a message was last sent (ms since the epoch, the sender's clock): its retry's
    requeue (``Retries`` stamps ``requeue_timestamp``), else its ``message_timestamp``."""
    for sent in (message.options.get("requeue_timestamp"), message.message_timestamp):
        if isinstance(sent, (int, float)) and not isinstance(sent, bool):
            return float(sent)
    return None


class Consumer(dramatiq.Consumer):
    """Messages of one Dramatiq queue, claimed with leases (see the module doc).

    Args:
        broker: The broker.
        store: The queue's store.
        prefetch: Most claims held (returned and not yet settled, or cached).
        timeout: How long ``__next__`` waits for a message (ms).
    """

    def __init__(self, broker: Broker, store: Store, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.store = store
        self.queue_name = store.name
        self.prefetch = max(1, prefetch)
        self.timeout = timeout
        self._cache: collections.deque[Proxy] = collections.deque()
        self._outstanding: dict[str, Delivery] = {}
        self._room = threading.Condition()

    @property
    def outstanding_message_count(self) -> int:
        """Claims returned and not settled yet, plus those waiting in the cache."""
        with self._room:
            return len(self._outstanding) + len(self._cache)

    def __next__(self) -> MessageProxy | None:
        try:
            return self._next()
        except ConnectionLost as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def _next(self) -> MessageProxy | None:
        deadline = time.monotonic() + self.timeout / 1000
        while True:
            with self._room:
                if self._cache:
                    proxy = self._cache.popleft()
                    self._outstanding[proxy.belayq_delivery.token] = proxy.belayq_delivery
                    return proxy
                room = self.prefetch - len(self._outstanding)
                if room <= 0:  # wait for a settle to make room, not in a busy loop
                    self._room.wait(max(0.0, deadline - time.monotonic()))
                    if self.prefetch - len(self._outstanding) <= 0:
                        return None
                    continue
            got = self.store.core.claim(
                timeout=max(0.0, deadline - time.monotonic()), count=room
            )
            if not got:
                return None
            try:
                proxies = self._admit(got)
            except BaseException:
                self._give_back(got)
                raise
            with self._room:
                self._cache.extend(proxies)

    def _give_back(self, deliveries: list[Delivery]) -> None:
        """Hand back claims that could not be made into messages (Redis failed while one was
        dead-lettered): uncounted, at once; or, when Redis cannot be reached either, stop
        keeping them, so they come back after their lease rather than being kept while
        nothing runs them."""
        try:
            self.store.core.release(deliveries)
        except Exception:
            self.store.core.forget(deliveries)

    def _admit(self, deliveries: list[Delivery]) -> list[Proxy]:
        """The proxies of claimed messages; a body that cannot be decoded is dead-lettered
        with the reason (an id whose body is missing never comes: the claim dead-letters
        it)."""
        out = []
        for delivery in deliveries:
            try:
                message = dramatiq.Message.decode(delivery.payload)
            except Exception as exc:
                self.store.core.dead_letter(delivery, f"undecodable message: {exc!r}"[:500])
                continue
            core = self.store.core
            if (delivery.deliveries == 1 and isinstance(core, ReliableQueue)
                    and published_ms_of(delivery.id) is None):
                # An id the core did not choose (stock's uuid4) tells no publish time: the
                # body does (a retry's requeue, else its send), for the queue-wait histogram.
                core.first_claimed(delivery, sent_ms(message))
            # A delayed message waited in Redis: it is due now, and runs here.
            message.options.pop("eta", None)
            if message.queue_name != self.queue_name:  # a copy of a stock delay queue's
                message = message.copy(queue_name=self.queue_name)
            out.append(Proxy(message, delivery))
        return out

    def _settled(self, message: MessageProxy) -> Delivery | None:
        delivery = getattr(message, "belayq_delivery", None)
        if not isinstance(delivery, Delivery):
            return None
        with self._room:
            self._outstanding.pop(delivery.token, None)
            self._room.notify()
        return delivery

    def ack(self, message: MessageProxy) -> None:
        delivery = self._settled(message)
        if delivery is None:
            return
        try:
            if not self.store.ack(delivery):
                log.warning("ack of message %s on %s refused: its lease had expired and it "
                            "was claimed again", message.message_id, self.queue_name)
        except ConnectionLost as exc:
            self._retain(delivery)
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def nack(self, message: MessageProxy) -> None:
        delivery = self._settled(message)
        if delivery is None:
            return
        try:
            # Counted with the runs of its earlier ids, and kept with its retries reset.
            runs_before = getattr(message, "belayq_runs_before", 0)
            if not self.store.core.dead_letter(
                delivery, reason_of(message, self.broker.actors), runs_before=runs_before,
                payload=dead_letter_body(message),
            ):
                log.warning("dead-lettering message %s on %s refused: it was claimed again",
                            message.message_id, self.queue_name)
        except ConnectionLost as exc:
            self._retain(delivery)
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def _retain(self, delivery: Delivery) -> None:
        """Count a claim as outstanding again after a settle that could not reach Redis
        (Dramatiq retries it)."""
        with self._room:
            self._outstanding[delivery.token] = delivery

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        deliveries = [d for d in (self._settled(m) for m in messages) if d is not None]
        if deliveries:
            try:
                self.store.core.release(deliveries)
            except ConnectionLost as exc:  # left to their leases
                raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def close(self) -> None:
        with self._room:
            cached, self._cache = list(self._cache), collections.deque()
        if cached:
            try:
                self.store.core.release([p.belayq_delivery for p in cached])
            except ConnectionLost:
                log.warning("could not hand %d prefetched messages of %s back; they return "
                            "after their lease", len(cached), self.queue_name)


class StockInlet(dramatiq.Consumer):
    """The consumer of a stock delay queue (``<queue>.DQ``): it moves what stock
    ``RedisBroker`` producers put in stock's lists of the queue into the broker's store of
    it, and hands nothing to the worker. In stock's keys that is the ``.DQ`` list, whose
    messages go into the core's delayed set, due at their ``eta`` (stock producers' ready
    messages are in the queue's own list already). With ``shards`` it is the queue's stock
    list too, so stock producers can go on sending during a rolling migration into belayq's
    own keys. A crash between the move and the ack moves a message again, deduplicated by
    its id. Until a stock list exists it only looks for it (one ``EXISTS`` per
    ``timeout``), so a fleet that never ran stock producers gets no queue of that name."""

    def __init__(self, broker: Broker, queue_name: str, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.timeout = timeout
        self._missing = list(broker.stock_sources(q_name(queue_name)))
        self._sources: list[Store] = []

    def __next__(self) -> MessageProxy | None:
        try:
            self._move()
        except ConnectionLost as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        return None

    def _move(self) -> None:
        for name in list(self._missing):
            if self.broker.stock_list_exists(name):
                self._missing.remove(name)
                self._sources.append(self.broker.stock_store(name))
        if not self._sources:
            time.sleep(self.timeout / 1000)
            return
        for store in self._sources:
            got = store.core.claim(timeout=self.timeout / 1000 / len(self._sources),
                                   count=MOVE_BATCH)
            try:
                self._convert(store, got)
            except BaseException:  # what was not moved goes back to the stock list at once
                try:
                    store.core.release(got)
                except Exception:
                    store.core.forget(got)
                raise

    def _convert(self, store: Store, got: list[Delivery]) -> None:
        target = self.broker.store(q_name(self.queue_name))
        for delivery in got:
            try:
                message = dramatiq.Message.decode(delivery.payload)
            except Exception as exc:
                store.core.dead_letter(delivery, f"undecodable message: {exc!r}"[:500])
                continue
            eta = message.options.pop("eta", None)
            delay_ms = max(0, int(eta) - current_millis()) if isinstance(eta, (int, float)) else 0
            message = message.copy(queue_name=target.name)
            message_id = str(message.options.get("redis_message_id") or delivery.payload.decode())
            target.publish(message_id, message.encode(), delay_ms=delay_ms,
                           dedup_id=f"stock:{message_id}")
            store.ack(delivery)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """Nothing to hand back: no message of a delay queue reaches the worker."""


class StartReports(Middleware):
    """Reports each run to the core as Dramatiq starts it: from then on it counts toward
    ``max_deliveries`` (a message that kills its worker every run is dead-lettered), while
    prefetched messages never started come back uncounted.

    A message claimed before (its holder died or froze) is reported before it runs. A first
    claim's report rides the lease keeper's next renewal (its next beat), which
    costs no call of its own: a run that kills its worker before that renewal is not
    counted, so a poison message runs at most once more than ``max_deliveries``. With the
    broker's ``strict_runs`` every report is sent before the run (one more call per
    message)."""

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        delivery = getattr(message, "belayq_delivery", None)
        store = getattr(broker, "store", None)
        if not isinstance(delivery, Delivery) or store is None:
            return
        now = delivery.deliveries > 1 or bool(getattr(broker, "strict_runs", False))
        try:
            store(message.queue_name).core.start([delivery], now=now)
        except ConnectionLost as exc:  # the lease keeper's next extend reports it
            log.info("start report of %s not sent now (%s); the lease keeper sends it",
                     message.message_id, exc)
