"""``belayq://`` and ``belayqs://``: the kombu transports (see :mod:`.channel` for what
they keep from the stock Redis transport and what they replace)."""

from __future__ import annotations

import logging
import ssl
import threading
from typing import Any

import redis
from kombu.transport import redis as _stock

from belayq import ReliableQueue
from belayq import __version__ as belayq_version
from belayq.registry import Registry
from belayq.revocations import Revocations

from . import celery_state, options, scheduled, topology
from .channel import Channel
from .poller import Poller
from .qos import QoS
from .starts import connect_signals
from .tags import Tags

log = logging.getLogger("belayq.kombu")

stock: Any = _stock  # kombu's annotations are partial; Any to mypy --strict

_Channel = Channel


class Transport(stock.Transport):  # type: ignore[misc]
    """``belayq://``: Celery treats it as Redis (``driver_type``), with belayq's guarantees."""

    Channel = Channel
    driver_type = "redis"
    driver_name = "belayq"
    polling_interval = None
    brpop_timeout: float = options.POLL_TIMEOUT_S
    implements = stock.Transport.implements.extend(
        asynchronous=True, batch_publish=False,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )
    supports_batch_publish = False

    def __init__(self, client: Any, **kwargs: Any) -> None:
        self.topology = topology.of_connection(client)
        options.check(client.transport_options or {}, kind=self.topology.kind)
        if self.topology.tls and not client.ssl:
            client.ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        if self.topology.kind == topology.CLUSTER:
            from .cluster import ClusterChannel

            self.Channel = ClusterChannel
            base: tuple[type[BaseException], ...] = stock.Transport.connection_errors
            self.connection_errors = (*base, *topology.cluster_errors())
        elif self.topology.kind == topology.SENTINEL:
            from .sentinel import SentinelChannel

            self.Channel = SentinelChannel
        super().__init__(client, **kwargs)
        self.claims = Tags()
        self.cycle = Poller(self.claims)
        connect_signals()
        if celery_state.in_worker():
            scheduled.install()  # `celery inspect scheduled` lists the delayed tasks it leads
        interval = (client.transport_options or {}).get("polling_interval")
        self.brpop_timeout = float(interval) if interval else options.POLL_TIMEOUT_S
        self.queues: dict[str, ReliableQueue] = {}
        self.publishers: dict[str, ReliableQueue] = {}  # with wait_replicas (Channel.publisher)
        self._core_client: redis.Redis | None = None
        self._revocations: Revocations | None = None
        self._bindings_noted: set[tuple[str, str]] = set()

    def revocations(self, channel: _Channel) -> Revocations:
        """The revokes Redis remembers for delayed tasks (one record per key prefix)."""
        if self._revocations is None:
            self._revocations = Revocations(
                self.core_client(channel), prefix=f"{channel.global_keyprefix}belayq",
                keep_ms=round(float(channel.revokes_keep) * 1000),
                max_ids=int(channel.revokes_max),
            )
        return self._revocations

    def core_client(self, channel: _Channel) -> redis.Redis:
        """The client the core's scripts run on (its own pool; thread-safe): of the one
        server, the cluster, or the primary the sentinels name."""
        if self._core_client is None:
            self._core_client = channel.new_core_client()
        return self._core_client

    #: Queue objects kept for publishing beyond which idle ones are forgotten (a worker
    #: answering `celery inspect` publishes to a new reply queue for every call).
    max_cached_queues = 256

    def forget_idle_queues(self) -> None:
        """Forget cached queue objects that hold no claim and that no channel consumes."""
        if len(self.queues) < self.max_cached_queues:
            return
        consumed = {q for ch in self.cycle._channels for q in ch._active_queues}
        for name, rq in list(self.queues.items()):
            if name not in consumed and not rq.held:
                self.forget_queue(name)

    def forget_queue(self, name: str) -> None:
        """Drop the cached queue object of ``name`` and stop keeping its leases."""
        self.publishers.pop(name, None)
        rq = self.queues.pop(name, None)
        if rq is not None:
            rq.close(release=False)

    def note_binding(self, channel: _Channel, queue: str, exchange: str) -> None:
        """Record (once per process) that ``exchange``'s binding table names ``queue``."""
        if (queue, exchange) in self._bindings_noted:
            return
        self._bindings_noted.add((queue, exchange))
        rq = channel.queue(queue)
        facts: dict[str, Any] = {"keyprefix": channel.global_keyprefix, "exchanges": [exchange]}
        if channel.sep != options.stock.Channel.sep:
            facts["sep"] = channel.sep
        Registry(rq.client, rq.config.prefix).note_facts("kombu", queue, facts, rq.namespace)

    def driver_version(self) -> str:
        return f"belayq {belayq_version}, redis-py {redis.__version__}"

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        cycle: Poller = self.cycle
        opts = connection.client.transport_options or {}
        timers = [
            (float(opts.get("sweep_interval", Channel.sweep_interval)), cycle.maybe_sweep),
            (float(opts.get("unacked_restore_interval", options.ADOPT_INTERVAL_S)),
             cycle.maybe_adopt),
            (float(opts.get("health_check_interval") or options.HEALTH_CHECK_INTERVAL_S),
             cycle.maybe_check_health),
        ]
        if hasattr(stock.Channel, "maybe_refresh_binding_expiry"):
            timers.append((options.BINDING_REFRESH_S, self._refresh_bindings))
        cycle.attach_hub(loop, timers)
        self.claims.defer_thread = threading.get_ident()
        add_reader, on_readable = loop.add_reader, self.on_readable

        readers = loop.readers
        added: dict[int, Any] = {}  # fd -> the socket it was added to the loop for

        def on_poll_start() -> None:
            cycle.on_poll_start()
            # Each socket is added to the loop once (the stock transport adds every fd on
            # every tick: two system calls each); again when its fd now names another
            # socket, or the loop dropped it.
            polled = cycle.sockets()
            for fd, sock in polled.items():
                if added.get(fd) is not sock or fd not in readers:
                    add_reader(fd, on_readable, fd)
                    added[fd] = sock
            if len(added) > len(polled):
                for fd in [fd for fd in added if fd not in polled]:
                    del added[fd]

        loop.on_tick.add(on_poll_start)

    def _refresh_bindings(self) -> None:
        for channel in list(self.cycle._channels):
            try:
                channel.maybe_refresh_binding_expiry()
            except channel.connection_errors:
                log.debug("binding expiry refresh failed; will retry", exc_info=True)

    def on_readable(self, fileno: int) -> None:
        self.cycle.on_readable(fileno)

    def close_connection(self, connection: Any) -> None:
        # Messages of a closed connection may still be acked (tasks that ran through a
        # reconnect); nothing polls this transport any more to flush deferred acks.
        self.claims.defer_thread = None
        self.claims.flush()
        super().close_connection(connection)
        for rq in self.queues.values():
            if rq.unsettled:
                rq.retry_unsettled()  # its keeper retries what is still left
            if not rq.held:  # what is still held belongs to running tasks (see tags.Kept)
                rq.close(release=False)


class SSLTransport(Transport):
    """``belayqs://``: the same over TLS (certificates verified unless ``broker_use_ssl``
    says otherwise)."""

    def __init__(self, client: Any, **kwargs: Any) -> None:
        if not client.ssl:
            client.ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        super().__init__(client, **kwargs)


__all__ = ["Channel", "QoS", "SSLTransport", "Transport"]
