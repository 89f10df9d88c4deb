"""Queue configuration: a frozen dataclass with units in the names and documented defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConfigError

DEFAULT_PRIORITY_STEPS: tuple[int, ...] = tuple(range(10))
"""A queue made with defaults honours priorities 0..9, each its own level, 0 served first."""

EXHAUSTED = ("dead", "deliver")
"""The values of :attr:`QueueConfig.exhausted`."""


@dataclass(frozen=True)
class QueueConfig:
    """How one queue behaves. Every field is keyword-only and validated on creation.

    Attributes:
        lease_ms: How long a claim stays valid without an extension (ms, server clock).
        max_deliveries: Runs (started attempts) after which a message that is nacked, or
            whose started claim's lease expires, goes to the dead-letter set instead of back
            to ready. Claims that never started are not runs.
        heartbeat_interval_ms: How often the lease keeper extends the leases this process
            holds, at most: the keeper beats every ``heartbeat_interval_ms`` or
            ``sweep_interval_ms``, whichever is shorter (every second with the defaults).
            Defaults to a third of ``lease_ms``.
        sweep_interval_ms: How often each consumer's lease keeper runs the sweep (ms).
        sweep_limit: How many expired leases one claim sweeps before claiming (bounded work).
        dead_letter_max: Cap of the dead-letter set; the oldest dead letters are dropped.
        dedup_window_ms: How long a ``dedup_id`` suppresses republishing (ms).
        retry_base_ms: First backoff of ``nack(delay_ms=None)``; doubles per delivery (ms).
        retry_max_ms: Cap of that backoff before jitter (ms).
        priority_steps: Priority levels, lowest number served first (kombu's convention);
            a priority maps to the largest step not above it; one above the last step, or
            below 0, is refused. Default: 0..9, one level each (a queue that adopts existing
            lists has one level per list it is given).
        starvation_floor: Opt-in share of claims (0..0.5) taken from the lowest-priority
            non-empty level, so bulk work keeps moving under sustained urgent load.
        payload_in_list: When true the ready list holds the payloads themselves (a list that
            stock kombu producers or RQ push to); when false it holds ids and the payload
            lives in the queue's payloads hash.
        ready_head: Which end of the ready lists is claimed next: ``"right"`` (producers
            LPUSH, as kombu's) or ``"left"`` (producers RPUSH, as RQ's ``rq:queue:NAME``).
        bell: When the first priority level is empty but a lower one holds work, put one
            wake-up entry in the first level so a claimer blocked on it (BLMOVE) wakes at
            once. Turn it off while consumers that are not belayq pop the same lists (a
            stock kombu worker cannot decode the entry); blocked claimers then look at the
            lower levels every ``sweep_interval_ms`` instead.
        prefix: First part of every key belayq builds.
        claim_starts: A claim counts as a started attempt at once (a consumer that runs
            what it claims). Set False when the consumer prefetches: it then reports each
            start with :meth:`~belayq.ReliableQueue.start`, and a message whose holder died
            before starting it goes back without moving toward the dead-letter set.
        reply_window_ms: How long the reply of a publish or claim is kept, so that a call
            redis-py re-sends after a dropped connection answers as the first did (ms).
        wait_replicas: After each publish and settle, wait until this many replicas have
            the write (Redis WAIT; with ``wait_aof``, WAITAOF: on their disks and the
            primary's). 0 = do not wait (asynchronous replication: a failover may lose the
            last writes). A wait that times out raises ``DurabilityError``.
        wait_timeout_ms: Longest wait for the replicas (ms).
        wait_aof: Wait for the AOF fsync too (WAITAOF, Redis 7.2+ or Valkey, with
            appendonly on). None = when ``wait_replicas`` is set and the server has both,
            with ``appendfsync always`` (with ``everysec`` a replica confirms its fsync
            about once a second, and each call would wait that long);
            True = required: each publish and settle waits until the primary's AOF has it
            on disk, and its ``wait_replicas`` replicas' AOFs too (``wait_replicas=0``: the
            primary's only); a server without WAITAOF or without appendonly is refused when
            the queue opens; False = never.
        cluster_retry_ms: How long a script call is retried while its cluster slot is
            migrating (TRYAGAIN, ASK, MOVED) or its master fails over (connection errors,
            CLUSTERDOWN) before ``ConnectionLost`` (ms). Keep it above the cluster's
            failover time (``cluster-node-timeout`` plus the election, a few seconds).
        exhausted: What happens to a message that has run ``max_deliveries`` times when that
            last run is lost or nacked: ``"dead"`` moves it to the core's dead-letter set;
            ``"deliver"`` hands it to a consumer once more, marked
            :attr:`~belayq.Delivery.exhausted`, for hosts that keep their own failed-job
            registry (RQ's FailedJobRegistry): the consumer records the failure there and
            acks the claim without running it. If that claim is lost too (its consumer died),
            the core dead-letters the message.
        history_max: Keep the last this many acked messages and the last this many
            dead-lettered ones, with the ack's result or the reason, delivery and run counts
            and timings (:meth:`~belayq.ReliableQueue.history`). 0 = off (the default:
            nothing is written).
        history_ttl_ms: Each history list expires this long after its last write (ms).
        events: Publish an event on the queue's channel (``QueueKeys.events``) when a
            message completes, fails, is reclaimed or dead-lettered (sharded pub/sub on Redis
            7.0+, so it works on a cluster). Off by default.
        lua_functions: Run the transitions as belayq's Redis FUNCTION library (FCALL)
            rather than as scripts (EVALSHA): cheaper per call, and kept by restarts and
            replicas. None = when the client reaches one Redis 7.0+ server and may load
            it; True = required; False = never. Clusters and fakeredis use scripts.
        transient: A queue whose name lives only as long as its messages (a reply queue
            named anew for each request): it keeps no counters (no stats hash, so
            :meth:`~belayq.ReliableQueue.stats` shows sizes only), no reply memo (a call
            redis-py re-sends after a dropped connection runs again) and no dedup memo
            (``dedup_id`` is refused), so once its messages are settled it leaves no key
            behind. It applies no starvation floor (which needs a counter) and keeps no
            history (``history_max`` must be 0).
    """

    lease_ms: int = 30_000
    max_deliveries: int = 5
    heartbeat_interval_ms: int | None = None
    sweep_interval_ms: int = 1_000
    sweep_limit: int = 128
    dead_letter_max: int = 10_000
    dedup_window_ms: int = 3_600_000
    retry_base_ms: int = 1_000
    retry_max_ms: int = 300_000
    priority_steps: tuple[int, ...] = field(default=DEFAULT_PRIORITY_STEPS)
    starvation_floor: float = 0.0
    payload_in_list: bool = False
    ready_head: str = "right"
    bell: bool = True
    prefix: str = "belayq"
    claim_starts: bool = True
    reply_window_ms: int = 15_000
    wait_replicas: int = 0
    wait_timeout_ms: int = 1_000
    wait_aof: bool | None = None
    cluster_retry_ms: int = 10_000
    exhausted: str = "dead"
    history_max: int = 0
    history_ttl_ms: int = 86_400_000
    events: bool = False
    lua_functions: bool | None = None
    transient: bool = False

    def __post_init__(self) -> None:
        _positive("lease_ms", self.lease_ms, minimum=100)
        _positive("max_deliveries", self.max_deliveries)
        _positive("sweep_interval_ms", self.sweep_interval_ms, minimum=10)
        _positive("sweep_limit", self.sweep_limit)
        _positive("dead_letter_max", self.dead_letter_max)
        _positive("dedup_window_ms", self.dedup_window_ms)
        _positive("retry_base_ms", self.retry_base_ms)
        _positive("retry_max_ms", self.retry_max_ms)
        if self.heartbeat_interval_ms is not None:
            _positive("heartbeat_interval_ms", self.heartbeat_interval_ms, minimum=10)
            if self.heartbeat_interval_ms >= self.lease_ms:
                raise ConfigError(
                    f"heartbeat_interval_ms={self.heartbeat_interval_ms} must be shorter than "
                    f"lease_ms={self.lease_ms}, or every lease expires between two heartbeats"
                )
        steps = tuple(self.priority_steps)
        if not steps or any(not isinstance(s, int) or s < 0 for s in steps):
            raise ConfigError(f"priority_steps must be non-negative ints, got {steps!r}")
        if list(steps) != sorted(set(steps)):
            raise ConfigError(f"priority_steps must be strictly increasing, got {steps!r}")
        object.__setattr__(self, "priority_steps", steps)
        if not 0.0 <= self.starvation_floor <= 0.5:
            raise ConfigError(
                f"starvation_floor must be within 0..0.5, got {self.starvation_floor}"
            )
        if self.ready_head not in ("right", "left"):
            raise ConfigError(f"ready_head must be 'right' or 'left', got {self.ready_head!r}")
        if self.exhausted not in EXHAUSTED:
            raise ConfigError(
                f"exhausted must be one of {EXHAUSTED}, got {self.exhausted!r}"
            )
        if not isinstance(self.bell, bool):
            raise ConfigError(f"bell must be True or False, got {self.bell!r}")
        _positive("history_max", self.history_max, minimum=0)
        _positive("history_ttl_ms", self.history_ttl_ms)
        for flag in ("claim_starts", "events", "transient"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        for tri in ("wait_aof", "lua_functions"):
            if getattr(self, tri) not in (None, True, False):
                raise ConfigError(f"{tri} must be None, True or False, got {getattr(self, tri)!r}")
        if self.transient and self.history_max:
            raise ConfigError(
                f"a transient queue keeps no history: history_max must be 0, got "
                f"{self.history_max}"
            )
        _positive("reply_window_ms", self.reply_window_ms, minimum=100)
        _positive("wait_replicas", self.wait_replicas, minimum=0)
        _positive("wait_timeout_ms", self.wait_timeout_ms)
        _positive("cluster_retry_ms", self.cluster_retry_ms, minimum=0)
        if not self.prefix or any(c in self.prefix for c in "{}"):
            raise ConfigError(f"prefix must be non-empty and hold no braces, got {self.prefix!r}")

    @property
    def heartbeat_ms(self) -> int:
        """The effective heartbeat period (ms)."""
        return self.heartbeat_interval_ms or max(10, self.lease_ms // 3)

    @property
    def durable(self) -> bool:
        """Whether writes wait for replicas (``wait_replicas``) or for the AOF's fsync
        (``wait_aof=True``)."""
        return self.wait_replicas > 0 or self.wait_aof is True

    @property
    def dead_after_runs(self) -> int:
        """Runs after which the scripts dead-letter a failed message: ``max_deliveries``,
        plus the final hand-over claim when ``exhausted="deliver"``."""
        return self.max_deliveries + (1 if self.exhausted == "deliver" else 0)

    @property
    def floor_every(self) -> int:
        """Every how many claims one goes to the lowest level (0 = never)."""
        return round(1 / self.starvation_floor) if self.starvation_floor > 0 else 0


def check_count(count: int) -> None:
    """Refuse a message count that is not an int >= 1 (``claim(count=...)``, batches)."""
    _positive("count", count)


def _positive(name: str, value: object, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
