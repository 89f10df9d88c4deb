"""``belayq_dramatiq.Broker``: a drop-in for ``dramatiq.brokers.redis.RedisBroker`` whose
messages are claimed with fenced leases.

It keeps stock RedisBroker's keys (message ids in ``dramatiq:<queue>``, bodies in
``dramatiq:<queue>.msgs``), so stock producers and consumers can share a queue with it
during a rolling migration. What changes: a claim is a lease the worker's lease keeper
extends, so a killed worker's messages come back within the lease plus one sweep (not after
a 60 s heartbeat and a 0.1% maintenance roll); acks are fenced; a delayed message (``eta``,
``delay``, a retry's backoff) waits in Redis, in the core's delayed set, not in a worker's
memory; a message whose runs keep killing their worker is dead-lettered after
``max_deliveries`` runs; ``nack`` dead-letters into the core's dead-letter set with the
reason. Dramatiq's middleware (Retries, AgeLimit, TimeLimit, Callbacks, Pipelines, Results,
Prometheus...) is untouched.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

import dramatiq
import redis
from dramatiq.common import current_millis, dq_name
from dramatiq.errors import QueueJoinTimeout
from dramatiq.middleware import Middleware

from belayq import ConfigError, QueueConfig
from belayq.client_info import is_cluster
from belayq.keys import dramatiq_layout, shard_names
from belayq.option_names import closest, misspells, refuse_misspelled, unknown_option

from .consumer import Consumer, StartReports, StockInlet
from .failed import FailedRuns
from .parent import ParentWatch
from .store import ShardedStore, Store, core_options
from .tracing import ProcessSpans

log = logging.getLogger("belayq_dramatiq")

#: Stock RedisBroker arguments that configure its maintenance pass, which belayq replaces
#: with leases and the sweep: accepted, so a drop-in needs no edit, and unused.
STOCK_ONLY = ("maintenance_chance", "heartbeat_timeout", "dead_message_ttl")


#: Broker's own keywords.
OWN_KEYWORDS = ("client_or_url", "url", "client", "middleware", "namespace", "lease_ms",
                "max_deliveries", "belayq_options", "stock_delays", "strict_runs", "shards")
#: belayq's options among them (what a misspelling is checked against).
BELAYQ_KEYWORDS = ("lease_ms", "max_deliveries", "belayq_options", "stock_delays",
                   "strict_runs", "shards")
#: The connection parameters ``redis.Redis`` takes, which ``**parameters`` passes on.
REDIS_PARAMETERS = frozenset(
    p.name for p in inspect.signature(redis.Redis.__init__).parameters.values()
    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
)


def _check_parameters(parameters: Mapping[str, Any], *, has_client: bool) -> None:
    """Refuse a keyword that misspells a belayq option, or that ``redis.Redis`` would be
    given and does not take (stock RedisBroker fails there too, with redis-py's
    ``TypeError``); with a client given, stock ignores ``**parameters``: warn instead.

    Raises:
        UnknownOption: Naming the keyword, the closest valid one and Broker's keywords.
    """
    what = "belayq_dramatiq.Broker option"
    more = "and redis.Redis connection parameters"
    config = {f.name for f in dataclasses.fields(QueueConfig)} - set(BELAYQ_KEYWORDS)
    unused = set(parameters) - REDIS_PARAMETERS - set(STOCK_ONLY)
    for name in sorted(unused):
        field = name if name in config else misspells(name, config)
        if field is not None:
            raise unknown_option(
                name, OWN_KEYWORDS, what=what, more=more,
                hint=f"{field!r} is a belayq.QueueConfig field: pass it as "
                f"belayq_options={{{field!r}: ...}}",
            )
    rest = refuse_misspelled(unused, BELAYQ_KEYWORDS, what=what, more=more)
    if rest and not has_client:
        near = closest(rest[0], [*OWN_KEYWORDS, *STOCK_ONLY, *REDIS_PARAMETERS])
        hint = f"did you mean {near!r}?" if near else "redis.Redis does not take it either"
        raise unknown_option(rest[0], [*OWN_KEYWORDS, *STOCK_ONLY], what=what, hint=hint,
                             more=more)
    for name in rest:
        warnings.warn(f"belayq_dramatiq.Broker ignores {name!r} beside a client, as stock "
                      "RedisBroker does", stacklevel=3)


def _client_of(client_or_url: Any, url: str | None, client: Any, parameters: dict[str, Any]) -> Any:
    if isinstance(client_or_url, str):
        url = client_or_url
    elif client_or_url is not None:
        client = client_or_url
    if client is not None:
        return client
    if url:
        parameters["connection_pool"] = redis.ConnectionPool.from_url(url)
    return redis.Redis(**parameters)


class Broker(dramatiq.Broker):
    """Dramatiq's Redis broker on belayq: ``dramatiq.set_broker(Broker(url=...))``.

    Args:
        client_or_url: A ``redis.Redis`` (a Sentinel ``master_for`` client too) or
            ``RedisCluster``, or a ``redis://`` URL.
        url: As stock RedisBroker's ``url``.
        client: As stock RedisBroker's ``client``.
        middleware: As stock RedisBroker's. The broker adds its own: the start reports
            first, then the failed runs' records, the process spans and the parent watch.
        namespace: The first part of stock RedisBroker's keys (default ``dramatiq``).
        lease_ms: How long a claim stays valid without an extension (ms); a killed
            worker's messages are back within it plus one sweep. Default 20 s (as the
            other adapters').
        max_deliveries: Runs after which a message whose worker died during each is
            dead-lettered. Default 5.
        belayq_options: Further :class:`belayq.QueueConfig` fields (``sweep_interval_ms``,
            ``wait_replicas``, ``dead_letter_max``, ...).
        stock_delays: Put delayed messages where stock RedisBroker does (the ``.DQ``
            list, for a worker to hold until due) rather than in Redis's delayed set: for
            producers deployed while only stock workers consume (nothing promotes the
            delayed set until a belayq worker runs). belayq workers move such messages into
            the delayed set as they come. Default False.
        strict_runs: Report each run to Redis before it starts, so a message whose runs
            kill their worker is dead-lettered after exactly ``max_deliveries`` runs. By
            default a message's first run is reported with the lease keeper's next renewal
            (no call of its own), and such a message may run once more. Default False.
        shards: Lay each queue out in belayq's own keys (``belayq:dramatiq:{<queue>}:...``)
            over this many hash slots (a :class:`~belayq.ShardedQueue`; 1: unsharded), with
            the bodies in the core's payloads: a publish is one round trip, and on a Redis
            Cluster a hot queue spreads over ``shards`` nodes. Stock ``RedisBroker``
            processes cannot share such a queue. Default None: stock's keys.
        **parameters: ``redis.Redis`` connection parameters, as stock RedisBroker's; its
            ``maintenance_chance``, ``heartbeat_timeout`` and ``dead_message_ttl`` are
            accepted and unused.

    Raises:
        UnknownOption: A keyword that misspells a belayq option (``lease_msec``), a
            :class:`belayq.QueueConfig` field outside ``belayq_options``, or a keyword
            ``redis.Redis`` does not take; it names the keyword and lists the valid ones.
        ConfigError: A bad or unknown belayq option, or ``lease_ms`` or
            ``max_deliveries`` in ``belayq_options``; a bad ``shards``, or ``shards`` with
            ``stock_delays`` or another ``namespace`` (both are stock's keys).
    """

    def __init__(
        self,
        client_or_url: Any = None,
        *,
        url: str | None = None,
        client: Any = None,
        middleware: list[Middleware] | None = None,
        namespace: str = "dramatiq",
        lease_ms: int = 20_000,
        max_deliveries: int = 5,
        belayq_options: Mapping[str, Any] | None = None,
        stock_delays: bool = False,
        strict_runs: bool = False,
        shards: int | None = None,
        **parameters: Any,
    ) -> None:
        _check_parameters(parameters, has_client=client is not None or (
            client_or_url is not None and not isinstance(client_or_url, str)))
        if shards is not None:
            shard_names("queue", shards)  # checks the count
            if stock_delays or namespace != "dramatiq":
                raise ConfigError(
                    "shards lays queues out in belayq's own keys: stock_delays and namespace "
                    "name stock RedisBroker's keys, and do not apply"
                )
        super().__init__(middleware=middleware)
        for name in STOCK_ONLY:
            parameters.pop(name, None)
        self.client = _client_of(client_or_url, url, client, parameters)
        self.namespace = namespace
        self.stock_delays = stock_delays
        self.strict_runs = strict_runs
        self.shards = shards
        self.broker_id = str(uuid.uuid4())
        own = sorted({"lease_ms", "max_deliveries"} & set(belayq_options or {}))
        if own:
            raise ConfigError(f"pass {own} as Broker's own keywords, not in belayq_options")
        self.options = core_options(
            {**dict(belayq_options or {}), "lease_ms": lease_ms, "max_deliveries": max_deliveries}
        )
        self.cluster = is_cluster(self.client)
        self.queues: set[str] = set()
        self._stores: dict[str, Store] = {}
        self._lock = threading.Lock()
        self.middleware.insert(0, StartReports())
        self.add_middleware(FailedRuns())
        self.add_middleware(ProcessSpans())
        self._parent_watch = ParentWatch()
        self.add_middleware(self._parent_watch)

    def store(self, queue_name: str) -> Store:
        """The store of a Dramatiq queue (opened once per broker): in belayq's own keys with
        ``shards``, else in stock's; a stock delay queue (``<queue>.DQ``) is always stock's
        list."""
        with self._lock:
            found = self._stores.get(queue_name)
            if found is None:
                if self.shards is None or queue_name in self.delay_queues:
                    found = Store(self.client, queue_name, namespace=self.namespace,
                                  cluster=self.cluster, options=self.options)
                else:
                    found = ShardedStore(self.client, queue_name, shards=self.shards,
                                         options=self.options)
                self._stores[queue_name] = found
            return found

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000
                ) -> dramatiq.Consumer:
        """A consumer of ``queue_name`` (of a stock delay queue ``<queue>.DQ``: one that
        moves what stock producers send into the queue, see :class:`StockInlet`)."""
        if queue_name in self.delay_queues:
            return StockInlet(self, queue_name, timeout)
        return Consumer(self, self.store(queue_name), prefetch, timeout)

    def stock_sources(self, queue_name: str) -> tuple[str, ...]:
        """The stock lists whose messages this broker moves into ``queue_name``: its delay
        queue's, and with ``shards`` its own."""
        own = (queue_name,) if self.shards is not None else ()
        return (dq_name(queue_name), *own)

    def stock_list_exists(self, queue_name: str) -> bool:
        """Whether stock RedisBroker's list of ``queue_name`` exists (stock producers wrote
        to it)."""
        layout = dramatiq_layout(queue_name, namespace=self.namespace, cluster=self.cluster)
        return bool(self.client.exists(str(layout["ready_key"])))

    def stock_store(self, queue_name: str) -> Store:
        """A store on stock's list of ``queue_name``, which stock producers write to; with
        ``shards``, the queue's own is not recorded in the registry (the queue is recorded
        in belayq's own keys)."""
        if queue_name in self.delay_queues or self.shards is None:
            found = self.store(queue_name)
            assert isinstance(found, Store)
            return found
        return Store(self.client, queue_name, namespace=self.namespace, cluster=self.cluster,
                     options=self.options, record=False)

    def declare_queue(self, queue_name: str) -> None:
        """Declare a queue (and its stock delay queue, drained into Redis's delayed set)."""
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        self.queues.add(queue_name)
        self.store(queue_name)  # recorded in the registry: tools see it
        self.emit_after("declare_queue", queue_name)
        delayed_name = dq_name(queue_name)
        self.delay_queues.add(delayed_name)
        self.emit_after("declare_delay_queue", delayed_name)

    def enqueue(self, message: dramatiq.Message[Any], *, delay: int | None = None
                ) -> dramatiq.Message[Any]:
        """Publish a message; with ``delay`` (ms) it waits in Redis until due.

        Returns:
            The message as stored (with its ``redis_message_id``; with ``eta`` when delayed).
        """
        message = message.copy(options={"redis_message_id": str(uuid.uuid4())})
        stored, delay_ms = message, max(0, delay or 0)
        if delay is not None:
            message = message.copy(options={"eta": current_millis() + delay})
            if self.stock_delays:  # as stock RedisBroker: on the .DQ list, ready now
                message = message.copy(queue_name=dq_name(message.queue_name))
                stored, delay_ms = message, 0
        self.emit_before("enqueue", message, delay)
        self.store(stored.queue_name).publish(
            message.options["redis_message_id"], stored.encode(), delay_ms=delay_ms
        )
        self.emit_after("enqueue", message, delay)
        return message

    def get_declared_queues(self) -> set[str]:
        return set(self.queues)

    def flush(self, queue_name: str) -> None:
        """Delete a queue's waiting and dead-lettered messages (claimed ones stay)."""
        self.store(queue_name).purge()
        if dq_name(queue_name) in self._stores:
            self._stores[dq_name(queue_name)].purge()

    def flush_all(self) -> None:
        for queue_name in list(self.queues):
            self.flush(queue_name)

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Wait until the queue holds no message that is not settled (ready, delayed or
        claimed). Meant for tests.

        Raises:
            QueueJoinTimeout: ``timeout`` (ms) elapsed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        names = [queue_name] + [n for n in (dq_name(queue_name),) if n in self._stores]
        while any(self.store(n).size() for n in names):
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)  # type: ignore[no-untyped-call]
            time.sleep(interval / 1000)

    def close(self) -> None:
        """Stop keeping leases (claims not settled return after their lease)."""
        self._parent_watch.stop()
        with self._lock:
            stores = list(self._stores.values())
        for s in stores:
            s.core.close(release=False)
