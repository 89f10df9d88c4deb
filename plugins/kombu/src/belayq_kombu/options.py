"""The transport options belayq:// accepts, and the checks that give one clear error each.

Celery hands ``broker_transport_options`` to kombu as ``Connection.transport_options``.
The stock Redis transport's names keep their meaning where it matches (``visibility_timeout``
is the lease, ``global_keyprefix``, ``priority_steps``, ``sep``, the socket options ...);
belayq adds its own (``max_deliveries``, ``sweep_interval`` ...). A name nobody reads, or a
value that cannot work, is refused when the transport is created, not ignored.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from kombu.transport import redis as _stock

from belayq import QueueConfig
from belayq.errors import ConfigError
from belayq.option_names import unknown_option

stock: Any = _stock  # kombu's annotations are partial; Any to mypy --strict

#: belayq's own options: name -> (default, what it is). Times are in seconds, like kombu's.
BELAYQ_OPTIONS: dict[str, tuple[Any, str]] = {
    "max_deliveries": (5, "runs after which a failed message goes to the dead-letter set"),
    "sweep_interval": (1.0, "period of each worker's recovery sweep (s)"),
    "lease_heartbeat_interval": (None, "how often held leases are extended at most (s; "
                                 "lease/3; the keeper beats every min(this, sweep_interval))"),
    "dead_letter_max": (10_000, "cap of each queue's dead-letter set"),
    "dead_letter_rejected": (True, "reject(requeue=False) dead-letters instead of dropping"),
    "claim_batch": (100, "most messages one claim takes when prefetch is unlimited"),
    "adopt_stock_unacked": (True, "requeue messages stock workers left in the unacked hash"),
    "stock_unacked_timeout": (3600.0, "age after which a stock unacked message is adopted (s)"),
    "starvation_floor": (0.0, "share of claims served from the lowest non-empty priority"),
    "blip_keep_max": (3600.0, "longest a running task's lease is kept past a reconnect (s)"),
    "priority_bell": (True, "wake-up entry in a queue's first list when only lower-priority "
                      "lists hold work; False while stock workers consume the same queues (unset: "
                      "as the queue's record says, True when none does)"),
    "native_delayed_delivery": (True, "a task whose ETA is ahead waits in Redis (the "
                                "queue's delayed set), not in a worker's memory"),
    "revokes_keep": (7 * 24 * 3600.0, "how long Redis remembers a revoke for the delayed "
                     "tasks it names (s)"),
    "revokes_max": (50_000, "most revokes Redis remembers (the oldest are dropped)"),
    "scheduled_max": (1000, "most delayed tasks a worker's `celery inspect scheduled` reply "
                      "lists from Redis"),
    "wait_replicas": (0, "replicas that must have each publish and settle before it returns "
                      "(Redis WAIT; 0 = asynchronous replication, a failover may lose the "
                      "last writes)"),
    "wait_timeout": (1.0, "longest wait for those replicas (s)"),
    "wait_aof": (None, "also wait until each publish is in the append-only file on disk "
                 "(WAITAOF: Redis 7.2+ or Valkey, appendonly yes): on the primary, and on "
                 "wait_replicas replicas; None = when wait_replicas is set and the servers "
                 "fsync always, True = always (refused where the server cannot)"),
}

#: The stock ``sentinel://`` options, read by ``belayq+sentinel://`` only.
SENTINEL_OPTIONS = ("master_name", "min_other_sentinels", "sentinel_kwargs")

#: Read by kombu's Connection itself (retry policy), never by a channel.
CONNECTION_OPTIONS = frozenset(
    {
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "connect_retries_timeout",
        "errback",
        "callback",
        "retry_errors",
        "timeout",
    }
)

#: Read by the transport (timers, poll timeout) rather than by a channel.
TRANSPORT_OPTIONS = frozenset(
    {
        "polling_interval",
        "unacked_restore_interval",
        "health_check_interval",
    }
)

#: Stock names belayq refuses, with the reason.
REFUSED: dict[str, str] = {
    "ack_emulation": "belayq always tracks unacked messages (that is its guarantee); "
    "remove ack_emulation",
    "sentinel_fanout_compat": "it bridges the fanout topic of kombu < 5.4 during a rolling "
    "upgrade of stock sentinel:// workers; belayq+sentinel:// uses the current topic only: "
    "upgrade the stock workers to kombu >= 5.4 first, then remove sentinel_fanout_compat",
    "reauth_check_interval": "belayq:// does not yet pass a streaming credential provider's "
    "rotated tokens to its long-lived claim connections; remove reauth_check_interval (with "
    "such a provider, use redis:// for now)",
}

#: Default lease when visibility_timeout is not given: recovery stays under 30 s.
DEFAULT_LEASE_S = 20.0

#: A visibility_timeout above this only delays recovery, since belayq extends leases.
LONG_LEASE_S = 300.0

#: A claimed task whose ETA is at most this far ahead (s) is handed to the worker, which
#: holds it until then as with the stock transport; one further ahead is deferred back to
#: the delayed set (with native_delayed_delivery).
DEFER_MIN_S = 1.0

#: The blocking claim's timeout without ``polling_interval`` (s), as the stock BRPOP's: how
#: often an idle worker's claim returns and is sent again.
POLL_TIMEOUT_S = 1.0

#: The stock ``unacked_restore_interval``: how often stock workers' unacked messages are
#: looked for (s); belayq's own leases need no such pass (the sweep runs every second).
ADOPT_INTERVAL_S = 10.0

#: The stock ``health_check_interval`` (s): pub/sub pings, and how long past its timeout a
#: blocking claim may stay unanswered before its socket counts as half-open.
HEALTH_CHECK_INTERVAL_S = 25.0

#: How often kombu >= 5.4's queue-expiry bindings are refreshed (s), as the stock transport.
BINDING_REFRESH_S = 1.0

#: How long past its own timeout a cancelled blocking claim may take to answer before its
#: connection is closed (s): its reply, if any, is leased and handed back.
CANCEL_GRACE_S = 1.0


def channel_option_names() -> tuple[str, ...]:
    """Names the channel copies from ``transport_options`` (the stock ones plus belayq's)."""
    return tuple(stock.Channel.from_transport_options) + tuple(BELAYQ_OPTIONS)


def known_options() -> frozenset[str]:
    """Every transport option name belayq:// accepts."""
    return (frozenset(channel_option_names()) | CONNECTION_OPTIONS | TRANSPORT_OPTIONS
            | frozenset(SENTINEL_OPTIONS))


def check(options: Mapping[str, Any], *, kind: str = "single") -> None:
    """Refuse unknown names and values that cannot work.

    Args:
        options: The transport options.
        kind: What the URL reaches: ``single``, ``cluster`` or ``sentinel``.

    Raises:
        ValueError: Naming the option, what is wrong and what to do.
    """
    known = known_options()
    if kind == "sentinel" and not options.get("master_name"):
        raise ValueError(
            "belayq+sentinel:// needs the transport option 'master_name' (the name the "
            "sentinels know the primary by), e.g. broker_transport_options={'master_name': "
            "'mymaster'}")
    for name in SENTINEL_OPTIONS:
        if name in options and kind != "sentinel":
            raise ValueError(
                f"belayq:// transport option {name!r} is for Redis Sentinel: use a "
                "belayq+sentinel://host:26379 URL (one per sentinel, ';' between them)")
    if "master_name" in options and not isinstance(options["master_name"], str):
        raise ValueError(f"belayq:// transport option 'master_name' must be a str, got "
                         f"{options['master_name']!r}")
    if options.get("sentinel_kwargs") is not None and not isinstance(
            options["sentinel_kwargs"], Mapping):
        raise ValueError(f"belayq:// transport option 'sentinel_kwargs' must be a dict, got "
                         f"{options['sentinel_kwargs']!r}")
    for name in options:
        if name in REFUSED:
            if name == "ack_emulation" and options[name]:
                continue
            raise ValueError(f"belayq:// transport option {name!r}: {REFUSED[name]}")
        if name not in known:
            raise unknown_option(name, known, what="belayq:// transport option")
    for name in ("visibility_timeout", "sweep_interval", "stock_unacked_timeout", "blip_keep_max",
                 "revokes_keep", "wait_timeout"):
        _number(options, name, minimum=0.1)
    for name in ("lease_heartbeat_interval", "polling_interval", "socket_timeout"):
        if options.get(name) is not None:
            _number(options, name, minimum=0.001)
    for name in ("max_deliveries", "dead_letter_max", "claim_batch", "max_connections",
                 "revokes_max", "scheduled_max"):
        _integer(options, name)
    for name in ("wait_replicas", "min_other_sentinels"):
        _integer(options, name, minimum=0)
    for name in ("dead_letter_rejected", "adopt_stock_unacked", "priority_bell",
                 "native_delayed_delivery"):
        if name in options and not isinstance(options[name], bool):
            raise ValueError(
                f"belayq:// transport option {name!r} must be True or False, got {options[name]!r}"
            )
    if options.get("wait_aof") not in (None, True, False):
        raise ValueError(
            f"belayq:// transport option 'wait_aof' must be None, True or False, got "
            f"{options['wait_aof']!r}"
        )
    for name in ("global_keyprefix", "sep"):
        if name in options and not isinstance(options[name], str):
            raise ValueError(
                f"belayq:// transport option {name!r} must be a str, got {options[name]!r}"
            )
    if "sep" in options and not options["sep"]:
        raise ValueError("belayq:// transport option 'sep' must not be empty")
    core_options(_Merged(options))


class _Merged:
    """Option values with belayq's defaults, read like channel attributes."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = options

    def __getattr__(self, name: str) -> Any:
        if name in self._options:
            return self._options[name]
        if name in BELAYQ_OPTIONS:
            return BELAYQ_OPTIONS[name][0]
        if name == "visibility_timeout":
            return DEFAULT_LEASE_S
        if name == "priority_steps":
            return stock.PRIORITY_STEPS
        raise AttributeError(name)


def core_options(source: Any) -> dict[str, Any]:
    """The :class:`~belayq.QueueConfig` fields for a channel (or anything with its attributes).

    Raises:
        ValueError: The core refuses a value; the message names the kombu option.
    """
    heartbeat = source.lease_heartbeat_interval
    fields: dict[str, Any] = {
        "lease_ms": _ms(source.visibility_timeout),
        "max_deliveries": source.max_deliveries,
        "sweep_interval_ms": _ms(source.sweep_interval),
        "heartbeat_interval_ms": None if heartbeat is None else _ms(heartbeat),
        "dead_letter_max": source.dead_letter_max,
        "priority_steps": tuple(source.priority_steps),
        "starvation_floor": float(source.starvation_floor),
        "payload_in_list": True,
        # A worker prefetches: its runs count as attempts once a task starts (reported before
        # it runs, see starts.py), so a crash loop does not dead-letter what never started.
        "claim_starts": False,
        "wait_replicas": int(source.wait_replicas),
        "wait_timeout_ms": _ms(source.wait_timeout),
        "wait_aof": source.wait_aof,
        # The registry of these queues sits under the transport's key prefix, as its lists.
        "prefix": _registry_prefix(getattr(source, "global_keyprefix", "")),
    }
    if _given(source, "priority_bell"):
        # Named only when set: a process that leaves it unset (a producer) takes the value
        # the queue's record holds, so it never rings a bell into lists stock workers pop.
        fields["bell"] = source.priority_bell
    try:
        QueueConfig(**fields)
    except ConfigError as exc:
        raise ValueError(f"belayq:// transport options do not work together: {exc}") from exc
    return fields


def _given(source: Any, name: str) -> bool:
    """Whether the transport options set ``name`` (kombu sets each given one on the
    channel; a class default is not given)."""
    given = source._options if isinstance(source, _Merged) else vars(source)
    return name in given


def _registry_prefix(keyprefix: str) -> str:
    """The core prefix of a channel's queues (their registry's key): under the channel's
    ``global_keyprefix``, unless that holds a hash tag, which a core prefix may not."""
    if "{" in keyprefix or "}" in keyprefix:
        return "belayq"
    return f"{keyprefix}belayq"


def _ms(seconds: float) -> int:
    return max(1, round(float(seconds) * 1000))


def _number(options: Mapping[str, Any], name: str, *, minimum: float) -> None:
    if name not in options:
        return
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < minimum:
        raise ValueError(
            f"belayq:// transport option {name!r} must be a number of seconds >= {minimum}, "
            f"got {value!r}"
        )


def _integer(options: Mapping[str, Any], name: str, *, minimum: int = 1) -> None:
    if name not in options:
        return
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"belayq:// transport option {name!r} must be an int >= {minimum}, got {value!r}")
