"""The kombu channel: stock Redis channel whose storage and consume path is belayq's core.

What stays stock (inherited): URL and connection handling, the binding table, fanout over
pub/sub (Celery's remote control, ``celery inspect`` and events), priorities' list names, the
JSON envelope. What belayq replaces: publish (:meth:`ReliableQueue.publish`), the blocking
pop (the core's blocking claim + ``lease_claimed``, see :mod:`.poller` and :mod:`.consume`),
the unacked hash (leases the core keeps alive while the worker lives), ack/reject/restore
(ack, nack, dead-letter, release), and the visibility-timeout restore (the core's sweep).

Each kombu queue is one :class:`~belayq.ReliableQueue` whose ready lists are kombu's own
lists (``celery``, ``celery\\x06\\x163``, ...) holding the stock envelopes, so stock producers,
``celery purge`` and a rollback to the stock transport keep working.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty
from time import time
from typing import Any

import redis
from kombu.transport import redis as _stock
from kombu.utils import json as _json

from belayq import Delivery, ReliableQueue
from belayq.discovery import hidden

from . import celery_state, delivering, eta, options, scheduled, topology
from .consume import Consume, Waiter
from .delivering import PUBLISHED_MS
from .qos import QoS
from .tags import Tags, give_back

log = logging.getLogger("belayq.kombu")

# kombu's annotations are partial; to mypy --strict these are Any.
stock: Any = _stock
dumps: Any = _json.dumps


class Message(stock.Channel.Message):  # type: ignore[misc]
    """kombu's message, remembering why its body did not decode: a consumer that then acks
    it (Celery's ``on_decode_error`` does) dead-letters it instead (see :class:`.qos.QoS`)."""

    undecodable: str | None = None

    def _decode(self) -> Any:
        try:
            return super()._decode()
        except Exception as exc:
            self.undecodable = f"body does not decode: {exc!r}"
            raise


class Channel(stock.Channel):  # type: ignore[misc]
    """A kombu channel whose queues are belayq queues."""

    QoS = QoS
    Message = Message
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
    blip_keep_max = options.BELAYQ_OPTIONS["blip_keep_max"][0]
    priority_bell = options.BELAYQ_OPTIONS["priority_bell"][0]
    native_delayed_delivery = options.BELAYQ_OPTIONS["native_delayed_delivery"][0]
    revokes_keep = options.BELAYQ_OPTIONS["revokes_keep"][0]
    revokes_max = options.BELAYQ_OPTIONS["revokes_max"][0]
    scheduled_max = options.BELAYQ_OPTIONS["scheduled_max"][0]
    wait_replicas = options.BELAYQ_OPTIONS["wait_replicas"][0]
    wait_timeout = options.BELAYQ_OPTIONS["wait_timeout"][0]
    wait_aof = options.BELAYQ_OPTIONS["wait_aof"][0]
    supports_batch_publish = False
    brpop_timeout: float = options.POLL_TIMEOUT_S
    _in_listen: Any = False
    # A demoted primary's READONLY is a reason to reconnect, not a fatal error (celery#7946).
    #: A blocking claim answered with a redirect follows its slot to another node.
    follows_slots = False
    #: A connection to a server that serves a replica is refused (topology.refuse_a_replica).
    refuses_replicas = True
    connection_class: Any = topology.FailoverConnection
    connection_class_ssl: Any = topology.FailoverSSLConnection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.refuses_replicas:
            try:
                info = self.connection.client
                topology.refuse_a_replica(self.client, f"{info.hostname}:{info.port}")
            except Exception:
                self.connection.cycle.discard(self)
                self._disconnect_pools()
                raise
        self.brpop_timeout = self.connection.brpop_timeout
        steps = list(self.priority_steps)
        if not steps or steps[0] != 0:
            raise ValueError(f"priority_steps must start with 0, as kombu's do; got {steps!r}")
        self._core_options = options.core_options(self)
        self._waiters: dict[str, Waiter] = {}
        self.lead_due: dict[str, float] = {}  # queue -> when to renew its lead (monotonic s)
        self._no_ack_queues: set[str] = set()
        self.claims: Tags = self.connection.claims
        self.consume = Consume(self)
        if float(self.visibility_timeout) > options.LONG_LEASE_S:
            log.warning(
                "visibility_timeout=%s s is belayq's lease: a dead worker's tasks come back "
                "only after it. belayq extends leases of live workers, so long tasks and ETAs "
                "no longer need a long visibility_timeout.", self.visibility_timeout)

    # -- the core queues ---------------------------------------------------------------

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """The stock channel builds a new redis-py client for every lookup (a binding-table
        read per publish); building one costs more than the command. Reuse one per pool."""
        if client:
            yield client
            return
        cached = self.__dict__.get("_sync_client")
        if cached is None or cached[0] is not self._pool:
            made = self._create_client()
            self.__dict__["_sync_client"] = cached = (self._pool, made)
        yield cached[1]

    @property
    def core_client(self) -> redis.Redis:
        client: redis.Redis = self.connection.core_client(self)
        return client

    def new_core_client(self) -> Any:
        """A client for the core's scripts (its own pool; thread-safe)."""
        params = self._connparams(asynchronous=False)
        params.setdefault("timeout", 20)
        pool = redis.BlockingConnectionPool(**params)  # type: ignore[no-untyped-call]
        return redis.Redis(connection_pool=pool)

    def claim_pool(self, rq: ReliableQueue) -> Any:
        """The pool the blocking claim of ``rq`` takes its connection from (its connections
        tell the poller when they close)."""
        return self.async_pool

    def claim_unblock(self) -> Any:
        """What cancels a pending blocking claim (CLIENT UNBLOCK on another connection)."""
        return self._unblock

    def queue(self, name: str) -> ReliableQueue:
        """The belayq queue behind kombu queue ``name`` (kombu's lists are its ready lists),
        for consuming and settling: its writes do not wait for replicas (see
        :meth:`publisher`)."""
        rq = self.connection.queues.get(name)
        if rq is None:
            rq = self._new_queue_object(name, wait_replicas=0, wait_aof=False)
            self.connection.forget_idle_queues()
            self.connection.queues[name] = rq
        assert isinstance(rq, ReliableQueue)
        return rq

    def publisher(self, name: str) -> ReliableQueue:
        """The belayq queue ``name`` for publishing: with ``wait_replicas``, a publish returns
        once that many replicas have the message, and with ``wait_aof`` once it is in the
        append-only file on disk (else ``DurabilityError``). Only publishes wait: a failover
        or crash that loses an unreplicated ack or requeue brings a message back
        (at-least-once), while one that loses a publish would lose the message; and a worker
        must not stop on a settle whose replicas are late."""
        if not self.wait_replicas and self.wait_aof is not True:
            return self.queue(name)
        rq = self.connection.publishers.get(name)
        if rq is None:
            rq = self._new_queue_object(name, wait_replicas=int(self.wait_replicas),
                                        wait_aof=self.wait_aof, keeper=False)
            if len(self.connection.publishers) >= self.connection.max_cached_queues:
                self.connection.publishers.clear()
            self.connection.publishers[name] = rq
        assert isinstance(rq, ReliableQueue)
        return rq

    def _new_queue_object(self, name: str, **options: Any) -> ReliableQueue:
        if hidden("kombu", name):
            # Celery's remote-control queues: a reply queue's name is new on every `celery
            # inspect`; they keep no counters or memo and are not recorded, so nothing of
            # them is left once their messages are taken.
            options = {"transient": True, "record": False, **options}
        names = [self.global_keyprefix + self._q_for_pri(name, s) for s in self.priority_steps]
        # Apps apart by their global_keyprefix on one Redis have queues apart (identity.py).
        return ReliableQueue(self.core_client, name, ready_key=names[0], level_keys=names[1:],
                             kind="kombu", namespace=self.global_keyprefix,
                             **{**self._core_options, **options})

    # -- publish -----------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        props = message.get("properties")
        if isinstance(props, dict) and PUBLISHED_MS not in props:
            # Read for an AMQP expiration, the queue wait and the oldest waiting message.
            props[PUBLISHED_MS] = int(time() * 1000)
        priority = min(self._get_message_priority(message, reverse=False),
                       self.priority_steps[-1])  # above the last step: the last, as kombu
        wait = eta.wait_ms(message, time() * 1000) if self.native_delayed_delivery else 0
        self.publisher(queue).publish(dumps(message), priority=priority, delay_ms=wait)
        if queue in getattr(self, "_expires", ()):  # kombu >= 5.4: queues with x-expires
            with self.conn_or_acquire() as client:
                self._maybe_update_queues_expire(client, queue)

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str,
                    **kwargs: Any) -> Any:
        """Fanout as the stock transport; a Celery revoke is first remembered in Redis, for
        the delayed tasks it names that no worker holds (see :mod:`.eta`)."""
        revoked = eta.revoked_task_ids(exchange, message, self.decode_body)
        if revoked:
            self.connection.revocations(self).revoke(revoked)
        return super()._put_fanout(exchange, message, routing_key, **kwargs)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> Any:
        """Bind as the stock transport does, and note in belayq's registry which binding
        table names the queue, so that the tools find the queues bound to this exchange
        that only stock producers fill."""
        ret = super()._queue_bind(exchange, routing_key, pattern, queue)
        if self.typeof(exchange).type != "fanout" and queue and not hidden("kombu", queue):
            self.connection.note_binding(self, queue, exchange)
        return ret

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
        if waiter.ready:
            ready, waiter.ready = waiter.ready, []
            give_back(waiter.rq, ready)
        entry = waiter.close(self.claim_unblock())
        if entry is not None:
            deliveries, _ = waiter.rq.lease_claimed(entry, 1)
            give_back(waiter.rq, deliveries)

    def _unblock(self, client_id: int) -> None:
        self.core_client.client_unblock(client_id)

    def deliver(self, queue: str, rq: ReliableQueue, deliveries: list[Delivery]) -> bool:
        """Hand claimed messages to kombu; give back what a raising callback never saw."""
        if queue not in self.connection._callbacks:  # the consumer was cancelled meanwhile
            give_back(rq, deliveries)
            return False
        envelopes = delivering.envelopes(self, queue, rq, deliveries,
                                         no_ack=queue in self._no_ack_queues)
        delivered = False
        try:
            while envelopes:
                raw, tag = envelopes.pop(0)
                try:
                    self.connection._deliver(raw, queue)
                except Exception as exc:
                    if tag in self.qos._delivered or isinstance(exc, self.connection_errors):
                        raise  # the consumer's own error, as with the stock transport
                    self._quarantine(tag, exc)  # kombu could not make a Message of it
                delivered = True
        finally:
            if envelopes:
                self.claims.release(tag for _, tag in envelopes)
        return delivered

    def _quarantine(self, tag: Any, exc: Exception) -> None:
        """Dead-letter a message kombu could not turn into a Message (a body that does not
        decode from its ``body_encoding`` ...) instead of letting the exception stop the
        worker. Its consumer never saw it."""
        log.error("belayq: dead-lettering a message kombu could not read: %r", exc,
                  exc_info=True)
        self.claims.reject(tag, requeue=False, dead_letter=True,
                           reason=f"delivery failed: {exc!r}")

    def _get(self, queue: str) -> dict[str, Any]:
        rq = self.queue(queue)
        deliveries, _ = rq.try_claim(1)
        for raw, _tag in delivering.envelopes(self, queue, rq, deliveries, no_ack=False):
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
        # Ready messages only, as ``celery purge`` on a stock fleet: countdown/ETA tasks
        # wait in the workers' memory there, and here in the delayed set; neither is purged.
        return int(self.queue(queue).purge(delayed=False))

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        """Delete the queue's messages and, unless some are claimed, its keys and queue
        object: an auto-delete queue (a ``celery inspect`` reply queue) leaves nothing."""
        rq = self.queue(queue)
        if rq.drop():
            self.connection.forget_queue(queue)
        else:
            rq.purge()
        super()._delete(queue, *args, **kwargs)

    # -- upkeep ------------------------------------------------------------------------

    def sweep(self) -> None:
        """The sweep of every consumed queue (each worker runs its own, bounded); in a
        Celery worker, the lead of each is taken or renewed too (see :func:`.scheduled.lead`)."""
        for name in self.active_queues:
            self.queue(name).sweep()
        if celery_state.in_worker():
            scheduled.lead(self)

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
        self.claims.flush()
        scheduled.resign(self)
        for name in list(self._waiters):
            try:
                self._close_waiter(name)
            except Exception:
                log.debug("closing waiter %s", name, exc_info=True)
        super().close()
