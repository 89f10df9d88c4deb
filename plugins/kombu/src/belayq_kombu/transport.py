"""The kombu transport: the stock Redis transport with its storage and consume path replaced
by belayq's core.

What stays stock (inherited): URL and connection handling, the binding table, fanout over
pub/sub (Celery's remote control, ``celery inspect`` and events), priorities' list names, the
JSON envelope. What belayq replaces: publish (:meth:`ReliableQueue.publish`), the blocking
pop (the core's blocking claim + ``lease_claimed``, see :mod:`.poller`), the unacked hash
(leases the core keeps alive while the worker lives), ack/reject/restore (ack, nack,
dead-letter, release), and the visibility-timeout restore (the core's sweep).

Each kombu queue is one :class:`~belayq.ReliableQueue` whose ready lists are kombu's own
lists (``celery``, ``celery\\x06\\x163``, ...) holding the stock envelopes, so stock producers,
``celery purge`` and a rollback to the stock transport keep working.
"""

from __future__ import annotations

import logging
import ssl
from queue import Empty
from time import time
from typing import Any

import redis
from kombu.transport import redis as _stock
from kombu.transport import virtual as _virtual
from kombu.utils import json as _json
from kombu.utils.objects import cached_property

from belayq import Delivery, ReliableQueue
from belayq import __version__ as belayq_version

from . import options
from .claims import KEPT, RETRY, Claims, running_tags, tag_of
from .poller import Poller, Waiter

log = logging.getLogger("belayq.kombu")

# kombu's annotations are partial; to mypy --strict these modules are Any.
stock: Any = _stock
virtual: Any = _virtual
dumps: Any = _json.dumps
loads: Any = _json.loads

#: Property stamped on messages that carry an AMQP ``expiration`` (ms since the epoch).
PUBLISHED_MS = "x-belayq-published-ms"


class QoS(stock.QoS):  # type: ignore[misc]
    """Prefetch accounting as in kombu; settlement through the core."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: Any) -> None:
        self.channel.claims.ack(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        self.channel.claims.reject(
            delivery_tag, requeue=requeue, dead_letter=self.channel.dead_letter_rejected
        )
        virtual.QoS.ack(self, delivery_tag)

    def restore_unacked(self, client: Any = None) -> list[Any]:
        """basic_recover: hand every unacked message back (uncounted)."""
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        self.channel.claims.release(tags)
        return []

    def restore_unacked_once(self, stderr: Any = None) -> None:
        """On close: release unstarted messages, keep the leases of running tasks."""
        self._on_collect.cancel()
        self._flush()
        state = self._delivered
        if getattr(state, "restored", None):
            return
        try:
            if not state:
                return
            running = running_tags()
            keep = [t for t in state if t in running]
            back = [t for t in state if t not in running]
            if not (self.restore_at_shutdown and self.channel.do_restore):
                for tag in back:
                    self.channel.claims.abandon(tag)
                back = []
            if back:
                log.info("belayq: releasing %d unstarted message(s)", len(back))
                self.channel.claims.release(back)
            if keep:
                log.info("belayq: keeping the leases of %d running task(s)", len(keep))
                KEPT.keep(keep, self.channel.claims)
            for tag in back:
                state.pop(tag, None)
        finally:
            state.restored = True

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        """The stock visibility-timeout hook: the core's sweep plus stock adoption."""
        self.channel.sweep()
        self.channel.adopt_stock()

    @cached_property
    def visibility_timeout(self) -> float:
        # Read by the stock restore_visible that adopts the stock unacked hash.
        return float(self.channel.stock_unacked_timeout)


class Channel(stock.Channel):  # type: ignore[misc]
    """A kombu channel whose queues are belayq queues."""

    QoS = QoS
    from_transport_options = options.channel_option_names()
    visibility_timeout = options.DEFAULT_LEASE_S

    max_deliveries = options.BELAYQ_OPTIONS["max_deliveries"][0]
    sweep_interval = options.BELAYQ_OPTIONS["sweep_interval"][0]
    lease_heartbeat_interval = options.BELAYQ_OPTIONS["lease_heartbeat_interval"][0]
    dead_letter_max = options.BELAYQ_OPTIONS["dead_letter_max"][0]
    dead_letter_rejected = options.BELAYQ_OPTIONS["dead_letter_rejected"][0]
    claim_batch = options.BELAYQ_OPTIONS["claim_batch"][0]
    adopt_stock_unacked = options.BELAYQ_OPTIONS["adopt_stock_unacked"][0]
    stock_unacked_timeout = options.BELAYQ_OPTIONS["stock_unacked_timeout"][0]
    starvation_floor = options.BELAYQ_OPTIONS["starvation_floor"][0]
    supports_batch_publish = False
    brpop_timeout: float = 1.0
    _in_listen: Any = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.brpop_timeout = self.connection.brpop_timeout
        steps = list(self.priority_steps)
        if not steps or steps[0] != 0:
            raise ValueError(f"priority_steps must start with 0, as kombu's do; got {steps!r}")
        self._core_options = options.core_options(self)
        self._waiters: dict[str, Waiter] = {}
        self._no_ack_queues: set[str] = set()
        self.claims: Claims = self.connection.claims
        if float(self.visibility_timeout) > options.LONG_LEASE_S:
            log.warning(
                "visibility_timeout=%s s is belayq's lease: a dead worker's tasks come back "
                "only after it. belayq extends leases of live workers, so long tasks and ETAs "
                "no longer need a long visibility_timeout.", self.visibility_timeout)

    # -- the core queues ---------------------------------------------------------------

    @property
    def core_client(self) -> redis.Redis:
        client: redis.Redis = self.connection.core_client(self)
        return client

    def queue(self, name: str) -> ReliableQueue:
        """The belayq queue behind kombu queue ``name`` (kombu's lists are its ready lists)."""
        rq = self.connection.queues.get(name)
        if rq is None:
            names = [self.global_keyprefix + self._q_for_pri(name, s) for s in self.priority_steps]
            rq = ReliableQueue(
                self.core_client, name, ready_key=names[0], level_keys=names[1:],
                **self._core_options,
            )
            self.connection.queues[name] = rq
        assert isinstance(rq, ReliableQueue)
        return rq

    # -- publish -----------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        props = message.get("properties") or {}
        if props.get("expiration") is not None and PUBLISHED_MS not in props:
            props[PUBLISHED_MS] = int(time() * 1000)
        priority = self._get_message_priority(message, reverse=False)
        self.queue(queue).publish(dumps(message), priority=priority)
        if queue in self._expires:
            with self.conn_or_acquire() as client:
                self._maybe_update_queues_expire(client, queue)

    def create_publish_batch(self, max_size: int) -> Any:
        raise NotImplementedError("belayq:// publishes each message through the core")

    # -- consume -----------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        else:
            self._no_ack_queues.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def _basic_cancel(self, consumer_tag: Any) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        ret = super()._basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack_queues.discard(queue)
            self._close_waiter(queue)
        return ret

    def waiters(self, create: bool = True) -> list[Waiter]:
        """The claim connections of the queues this channel consumes."""
        if not create:
            return list(self._waiters.values())
        out = []
        for name in self.active_queues:
            waiter = self._waiters.get(name)
            if waiter is None:
                waiter = self._waiters[name] = Waiter(self, name, self.queue(name))
            out.append(waiter)
        return out

    def _close_waiter(self, name: str) -> None:
        waiter = self._waiters.pop(name, None)
        if waiter is None:
            return
        entry = waiter.close(self._unblock)
        if entry is not None:
            deliveries, _ = waiter.rq.lease_claimed(entry, 1)
            waiter.rq.release(deliveries)

    def _unblock(self, client_id: int) -> None:
        self.core_client.client_unblock(client_id)

    def credit(self) -> int:
        """How many messages the next claim may take (prefetch credit, shared by queues)."""
        qos = self.qos
        if "can_consume" in vars(qos):  # Celery's worker_disable_prefetch patched it
            return 1 if qos.can_consume() else 0
        estimate = qos.can_consume_max_estimate()
        if estimate is None:
            return int(self.claim_batch)
        share = -(-int(estimate) // max(1, len(self._waiters)))
        return min(share, int(estimate), int(self.claim_batch))

    def on_claim_readable(self, waiter: Waiter) -> bool:
        """Read a blocking claim's reply and deliver what the lease script claimed."""
        entry = waiter.read()
        if entry is None:
            return False
        rq = waiter.rq
        credit = self.credit() if waiter.queue in self._active_queues else 0
        if credit < 1:
            deliveries, _ = rq.lease_claimed(entry, 1)
            rq.release(deliveries)
            return False
        deliveries, _ = rq.lease_claimed(entry, credit)
        return self._deliver(waiter.queue, rq, deliveries)

    def _deliver(self, queue: str, rq: ReliableQueue, deliveries: list[Delivery]) -> bool:
        """Hand claimed messages to kombu; give back what a raising callback never saw."""
        pending = list(deliveries)
        envelopes = self._envelopes(queue, rq, pending, no_ack=queue in self._no_ack_queues)
        delivered = False
        try:
            while envelopes:
                raw, _ = envelopes.pop(0)
                self.connection._deliver(raw, queue)
                delivered = True
        finally:
            if envelopes:
                self.claims.release(tag for _, tag in envelopes)
        return delivered

    def _envelopes(
        self, queue: str, rq: ReliableQueue, deliveries: list[Delivery], *, no_ack: bool
    ) -> list[tuple[dict[str, Any], Any]]:
        out: list[tuple[dict[str, Any], Any]] = []
        settle_now: list[Delivery] = []
        for d in deliveries:
            try:
                raw = loads(d.payload.decode('utf-8'))
                props = raw["properties"]
            except Exception as exc:
                rq.dead_letter(d, f"not a kombu message: {exc!r}"[:500])
                continue
            if _expired(props):
                settle_now.append(d)
                continue
            tag = tag_of(queue, d)
            props["delivery_tag"] = tag
            if d.deliveries > 1:
                info = props.get("delivery_info")
                if isinstance(info, dict):
                    info["redelivered"] = True
            if no_ack:
                settle_now.append(d)
            else:
                self.claims.add(tag, rq, d)
            out.append((raw, tag))
        if settle_now:
            rq.ack_many(settle_now)
        return out

    def _get(self, queue: str) -> dict[str, Any]:
        rq = self.queue(queue)
        deliveries, _ = rq.try_claim(1)
        for raw, _tag in self._envelopes(queue, rq, deliveries, no_ack=False):
            return raw
        raise Empty()

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:
            self.claims.ack(message.delivery_tag)
        return message

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        self.claims.release([message.delivery_tag])

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)

    # -- queue administration ----------------------------------------------------------

    def _size(self, queue: str) -> int:
        return int(self.queue(queue).stats()["ready"])

    def _purge(self, queue: str) -> int:
        return int(self.queue(queue).purge())

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.queue(queue).purge()
        super()._delete(queue, *args, **kwargs)

    # -- upkeep ------------------------------------------------------------------------

    def sweep(self) -> None:
        """The guarded (fleet-wide once per period) sweep of every consumed queue."""
        for name in self.active_queues:
            self.queue(name).sweep(guarded=True)

    def adopt_stock(self) -> None:
        """Requeue messages stock workers left unacked for ``stock_unacked_timeout``."""
        if not self.adopt_stock_unacked:
            return
        with self.conn_or_acquire() as client:
            if not client.zcard(self.unacked_index_key):
                return
        stock.QoS.restore_visible(self.qos, start=0, num=self.unacked_restore_limit, interval=1)

    # -- lifecycle -----------------------------------------------------------------------

    def _on_connection_disconnect(self, connection: Any) -> None:
        if self._in_listen is connection:
            self._in_listen = None
        if self.connection and self.connection.cycle:
            self.connection.cycle.on_connection_disconnect(connection)

    def close(self) -> None:
        for name in list(self._waiters):
            try:
                self._close_waiter(name)
            except Exception:
                log.debug("closing waiter %s", name, exc_info=True)
        super().close()


def _expired(props: dict[str, Any]) -> bool:
    expiration, published = props.get("expiration"), props.get(PUBLISHED_MS)
    if expiration is None or published is None:
        return False
    try:
        return time() * 1000 >= int(published) + int(expiration)
    except (TypeError, ValueError):
        return False


_Channel = Channel


class Transport(stock.Transport):  # type: ignore[misc]
    """``belayq://``: Celery treats it as Redis (``driver_type``), with belayq's guarantees."""

    Channel = Channel
    driver_type = "redis"
    driver_name = "belayq"
    polling_interval = None
    brpop_timeout: float = 1.0
    implements = stock.Transport.implements.extend(
        asynchronous=True, batch_publish=False,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )
    supports_batch_publish = False

    def __init__(self, client: Any, **kwargs: Any) -> None:
        options.check(client.transport_options or {})
        super().__init__(client, **kwargs)
        self.cycle = Poller()
        interval = (client.transport_options or {}).get("polling_interval")
        self.brpop_timeout = float(interval) if interval else 1.0
        self.claims = Claims()
        self.queues: dict[str, ReliableQueue] = {}
        self._core_client: redis.Redis | None = None

    def core_client(self, channel: _Channel) -> redis.Redis:
        """The client the core's scripts run on (its own pool; thread-safe)."""
        if self._core_client is None:
            params = channel._connparams(asynchronous=False)
            params.setdefault("timeout", 20)
            pool = redis.BlockingConnectionPool(**params)  # type: ignore[no-untyped-call]
            self._core_client = redis.Redis(connection_pool=pool)
        return self._core_client

    def driver_version(self) -> str:
        return f"belayq {belayq_version}, redis-py {redis.__version__}"

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        cycle: Poller = self.cycle
        cycle.on_poll_init(loop.poller)
        cycle._remove_fd = loop.remove
        add_reader, on_readable = loop.add_reader, self.on_readable

        def on_poll_start() -> None:
            cycle.on_poll_start()
            for fd in cycle.fds:
                add_reader(fd, on_readable, fd)

        loop.on_tick.add(on_poll_start)
        for tref in getattr(cycle, "_trefs", ()):
            tref.cancel()
        opts = connection.client.transport_options or {}
        sweep_every = float(opts.get("sweep_interval", Channel.sweep_interval))
        adopt_every = float(opts.get("unacked_restore_interval", 10))
        health_every = float(opts.get("health_check_interval") or 25)
        cycle._trefs = [
            loop.call_repeatedly(sweep_every, cycle.maybe_sweep),
            loop.call_repeatedly(adopt_every, cycle.maybe_adopt),
            loop.call_repeatedly(health_every, cycle.maybe_check_health),
        ]
        if hasattr(stock.Channel, "maybe_refresh_binding_expiry"):
            cycle._trefs.append(loop.call_repeatedly(1, self._refresh_bindings))

    def _refresh_bindings(self) -> None:
        for channel in list(self.cycle._channels):
            try:
                channel.maybe_refresh_binding_expiry()
            except channel.connection_errors:
                log.debug("binding expiry refresh failed; will retry", exc_info=True)

    def on_readable(self, fileno: int) -> None:
        self.cycle.on_readable(fileno)

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        if len(RETRY):
            RETRY.run()
        for rq in self.queues.values():
            if not rq.held:  # what is still held belongs to running tasks (see claims.KEPT)
                rq.close(release=False)


class SSLTransport(Transport):
    """``belayqs://``: the same over TLS (certificates verified unless ``broker_use_ssl``
    says otherwise)."""

    def __init__(self, client: Any, **kwargs: Any) -> None:
        if not client.ssl:
            client.ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        super().__init__(client, **kwargs)


__all__ = ["Channel", "QoS", "SSLTransport", "Transport"]
