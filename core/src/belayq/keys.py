"""The only place a Redis key string is built.

An owned queue ``q`` under prefix ``belayq`` keeps every key under ``belayq:{q}:``; the hash
tag puts them all on one cluster slot. A queue may instead adopt an existing ready list that
other programs push to (RQ's ``rq:queue:NAME``, kombu's ``celery``): its companion keys are
then named ``{<ready key>}:...``, which hashes to the slot of the untagged ready key.

Per-message state lives in per-queue hashes (``meta``, ``payloads``), never in keys of their
own, so every script declares every key it touches (a script during a slot migration runs
whole or fails whole), and a queue holds a fixed number of keys however many messages it has.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields

from redis.crc import key_slot

from .errors import ConfigError, CrossSlot

SCHEMA_VERSION = 2

#: Most shards one logical queue may have (:class:`~belayq.ShardedQueue`).
MAX_SHARDS = 64

#: Cluster hash slots.
SLOTS = 16384

#: The field of the logical queue's own stats hash (``belayq:{q}:stats``) that records its
#: shard count, when it is above 1.
SHARDS_FIELD = "shards"


def _has_hash_tag(key: str) -> bool:
    start = key.find("{")
    if start < 0:
        return False
    end = key.find("}", start + 1)
    return end > start + 1


@dataclass(frozen=True)
class QueueKeys:
    """Every key of one queue.

    Attributes:
        levels: The ready lists, one per priority step, highest priority first. ``levels[0]``
            is the list blocking claims wait on (BLMOVE source).
        processing: BLMOVE's landing zone: an entry stays there only until its lease is
            registered (claims made inside a script never land there).
        leases: Sorted set id -> lease deadline (ms, server clock): the record of a claim.
        delayed: Sorted set id -> due time (ms, server clock).
        dead: Sorted set id -> dead-lettered at (ms, server clock), capped.
        meta: Hash id -> the message's state: level, deliveries, attempts, token, error...;
            and ``"<id> trace"`` -> its publisher's trace context (:meth:`context_field`).
        payloads: Hash id -> payload bytes (for inline queues only while the entry is out of
            its list: held, delayed or dead).
        memo: Hash of short-lived records: replies of re-sendable calls, dedup ids.
        memo_exp: Sorted set memo field -> expiry (ms); the scripts enforce it.
        stats: Hash of counters and the schema version (schema 1 used the same key, so
            an old queue is recognised at construction).
        history_done: List of the last acked messages, newest first (``history_max``).
        history_failed: List of the last dead-lettered messages, newest first.
        observed: Hash of what the consumers observed for the metrics: histogram buckets,
            runs the framework reported failed... (:mod:`belayq.observing`).
        history_control: List of the last pauses and resumes, newest first.
        unpaused: List that holds the bell from a resume until the next pause: consumers
            that found the queue paused block on it (BLMOVE onto itself, so one bell wakes
            every one of them), instead of on the ready list.
        consumers: Sorted set ``"<tag> <host> <pid>"`` -> registered at (ms): the consumer
            processes whose claims' tokens start with ``<tag>.``, newest first.
        lead: Hash whose ``member`` is the consumer process (``"<tag> <host> <pid>"``)
            that answers for the queue's delayed messages in its framework's views of them
            (Celery's ``inspect scheduled``), so that each is shown once, not once per
            worker. It expires on its own a lease after its process last renewed it
            (lua/lead.lua).
    """

    levels: tuple[str, ...]
    processing: str
    leases: str
    delayed: str
    dead: str
    meta: str
    payloads: str
    memo: str
    memo_exp: str
    stats: str
    history_done: str
    history_failed: str
    observed: str
    history_control: str
    unpaused: str
    consumers: str
    lead: str

    @classmethod
    def build(
        cls,
        name: str,
        *,
        prefix: str = "belayq",
        steps: int = 1,
        ready_key: str | None = None,
        level_keys: Sequence[str] | None = None,
        payloads_key: str | None = None,
    ) -> QueueKeys:
        """Name the keys of queue ``name``.

        Args:
            name: The queue name; must hold no braces when belayq owns the keys.
            prefix: First part of every owned key.
            steps: Number of priority levels.
            ready_key: An existing list to use as the level-0 ready list.
            level_keys: Names of the ready lists of levels 1.. when ``ready_key`` is given.
            payloads_key: With ``ready_key``: an existing hash to use as the payloads hash
                (Dramatiq's ``<list>.msgs``, which stock producers write the bodies to).

        Raises:
            ConfigError: The name, the level keys or the payloads key do not fit.
        """
        if not name:
            raise ConfigError("queue name must not be empty")
        if ready_key is None:
            if "{" in name or "}" in name:
                raise ConfigError(f"queue name {name!r} must not contain braces")
            base = f"{prefix}:{{{name}}}:"
            levels = [f"{base}ready"] + [f"{base}ready:{i}" for i in range(1, steps)]
        else:
            base = f"{ready_key}:" if _has_hash_tag(ready_key) else f"{{{ready_key}}}:"
            extra = list(level_keys or [])
            if len(extra) != steps - 1:
                raise ConfigError(
                    f"ready_key {ready_key!r} with {steps} priority steps needs "
                    f"{steps - 1} level_keys, got {len(extra)}"
                )
            levels = [ready_key, *extra]
        if len(set(levels)) != len(levels):
            raise ConfigError(f"ready lists must be distinct, got {levels!r}")
        if payloads_key is not None and (
            ready_key is None or not isinstance(payloads_key, str) or not payloads_key
            or payloads_key in levels or payloads_key.startswith(base)
        ):
            raise ConfigError(
                "payloads_key must be a key name beside an adopted ready list (ready_key), "
                f"and none of the queue's other keys; got {payloads_key!r}"
            )
        return cls(
            levels=tuple(levels),
            processing=f"{base}processing",
            leases=f"{base}leases",
            delayed=f"{base}delayed",
            dead=f"{base}dead",
            meta=f"{base}meta",
            payloads=payloads_key or f"{base}payloads",
            memo=f"{base}memo",
            memo_exp=f"{base}memo:exp",
            stats=f"{base}stats",
            history_done=f"{base}history:done",
            history_failed=f"{base}history:failed",
            observed=f"{base}observed",
            history_control=f"{base}history:control",
            unpaused=f"{base}unpaused",
            consumers=f"{base}consumers",
            lead=f"{base}lead",
        )

    @property
    def events(self) -> str:
        """The queue's event channel (``events=True``): it shares the keys' prefix, so the
        scripts derive it from the stats key, and it hashes to the queue's slot."""
        return f"{self.stats[: -len('stats')]}events"

    @property
    def actions(self) -> str:
        """The list of what operators did to the queue from the dashboard, newest first."""
        return f"{self.stats[: -len('stats')]}actions"

    @property
    def rollups(self) -> str:
        """The hash of the queue's per-minute counter snapshots (:mod:`belayq.rollups`)."""
        return f"{self.stats[: -len('stats')]}rollups"

    @property
    def failures(self) -> str:
        """The hash of the failed runs a framework's adapter recorded (:mod:`belayq.failures`),
        one JSON record per job id."""
        return f"{self.stats[: -len('stats')]}failures"

    @property
    def failures_at(self) -> str:
        """The sorted set of those job ids, scored by when each failed (ms)."""
        return f"{self.stats[: -len('stats')]}failures:at"

    @staticmethod
    def context_field(message_id: str) -> str:
        """The field of the ``meta`` hash that holds the trace context of a message's
        publisher (``belayq.otel``), as the scripts name it: ``"<id> trace"``, by the plain
        id of an inline copy (``"<id> #<n>"``). It is written by the publish and deleted
        with the message; no message id holds a space, so it is no message's record."""
        plain, sep, n = message_id.rpartition(" #")
        return f"{plain if sep and n.isdigit() else message_id} trace"

    @property
    def ready(self) -> str:
        """The level-0 ready list (the BLMOVE source)."""
        return self.levels[0]

    def role(self, name: str) -> tuple[str, ...]:
        """The key(s) a script's contract block names ``name`` (``levels`` is all of them)."""
        if name == "levels":
            return self.levels
        if name not in self._roles():
            raise KeyError(f"no key role {name!r}; known: {sorted(self._roles())}")
        return (getattr(self, name),)

    @classmethod
    def _roles(cls) -> set[str]:
        return {f.name for f in fields(cls)} - {"levels"}

    def all_keys(self) -> tuple[str, ...]:
        """Every key of the queue."""
        return (*self.levels, *(getattr(self, r) for r in sorted(self._roles())))

    def check_one_slot(self) -> None:
        """Refuse a layout whose keys would cross cluster slots.

        Raises:
            CrossSlot: Naming the keys and the slots they hash to.
        """
        slots = {k: key_slot(k.encode()) for k in self.all_keys()}
        if len(set(slots.values())) > 1:
            detail = ", ".join(f"{k!r}->{s}" for k, s in slots.items())
            raise CrossSlot(
                "this queue's keys hash to more than one Redis Cluster slot, so its scripts "
                f"cannot run on a cluster: {detail}. Put one hash tag in the ready key and "
                "name the other ready lists with the same tag."
            )


#: kombu's separator between a queue's name and its priority step in its list names.
KOMBU_SEP = "\x06\x16"

#: kombu's default priority steps (its Redis transport's PRIORITY_STEPS).
KOMBU_STEPS = (0, 3, 6, 9)


def kombu_cluster_name(name: str) -> str:
    """kombu queue ``name`` as ``belayq+cluster://`` names its lists: inside a hash tag, so
    every priority level (``{name}\x06\x163`` ...) shares the slot of the first list. Stock
    kombu never ran on a cluster, so no stock producer expects the bare name there."""
    return f"{{{name}}}"


def kombu_layout(
    name: str, *, steps: Sequence[int] = KOMBU_STEPS, keyprefix: str = "", sep: str = KOMBU_SEP,
    cluster: bool = False,
) -> dict[str, object]:
    """The ReliableQueue arguments of kombu queue ``name`` as ``belayq://`` lays it out:
    kombu's own lists (``name``, ``name\x06\x163``, ...) hold the envelopes. With
    ``cluster``, as ``belayq+cluster://`` does (:func:`kombu_cluster_name`)."""
    if cluster:
        name = kombu_cluster_name(name)
    lists = [keyprefix + name] + [f"{keyprefix}{name}{sep}{s}" for s in steps[1:]]
    out: dict[str, object] = {"ready_key": lists[0], "level_keys": lists[1:],
                              "priority_steps": tuple(steps), "payload_in_list": True,
                              "kind": "kombu"}
    if keyprefix:  # two apps apart by their global_keyprefix are two queues
        out["namespace"] = keyprefix
    return out


def rq_layout(name: str) -> dict[str, object]:
    """The ReliableQueue arguments of RQ queue ``name`` as ``belayq_rq`` lays it out: RQ's
    ``rq:queue:NAME`` holds the job ids, pushed right, claimed from the left."""
    return {"ready_key": f"{RQ_QUEUE_PREFIX}{name}", "payload_in_list": True,
            "ready_head": "left", "kind": "rq"}


def dramatiq_layout(
    name: str, *, namespace: str = "dramatiq", cluster: bool = False
) -> dict[str, object]:
    """The ReliableQueue arguments of Dramatiq queue ``name`` as ``belayq_dramatiq`` lays it
    out: stock ``RedisBroker``'s own list ``<namespace>:<name>`` holds the message ids,
    pushed right, claimed from the left, and the hash ``<list>.msgs`` their bodies: the
    core's id mode, with that hash as its payloads. Stock Dramatiq never ran on a cluster,
    so with ``cluster`` the name sits in a hash tag (``dramatiq:{name}``), putting the list,
    its ``.msgs`` hash and the companion keys on one slot."""
    ready = f"{namespace}:{{{name}}}" if cluster else f"{namespace}:{name}"
    out: dict[str, object] = {"ready_key": ready, "payloads_key": dramatiq_messages(ready),
                              "ready_head": "left", "priority_steps": (0,), "kind": "dramatiq"}
    if namespace != DRAMATIQ_NAMESPACE:  # two apps apart by their namespace are two queues
        out["namespace"] = namespace
    return out


#: Stock RedisBroker's default ``namespace``.
DRAMATIQ_NAMESPACE = "dramatiq"


def dramatiq_messages(ready_key: str) -> str:
    """The hash of message bodies beside Dramatiq's list ``ready_key`` (id -> body), as
    stock ``RedisBroker`` names it."""
    return f"{ready_key}.msgs"


#: RQ's own list of its queues: a set of their list names (``rq:queue:NAME``).
RQ_QUEUES = "rq:queues"

#: The prefix of RQ's queue lists.
RQ_QUEUE_PREFIX = "rq:queue:"


def rq_queue_name(list_name: str) -> str | None:
    """The RQ queue whose list is ``list_name`` (a member of :data:`RQ_QUEUES`), or None."""
    return list_name[len(RQ_QUEUE_PREFIX):] if list_name.startswith(RQ_QUEUE_PREFIX) else None


def kombu_binding_key(exchange: str, keyprefix: str = "") -> str:
    """kombu's binding table of ``exchange`` (a set of ``routing_key SEP pattern SEP queue``
    members), as its Redis transport names it."""
    return f"{keyprefix}_kombu.binding.{exchange}"


def kombu_binding_queue(member: str, sep: str = KOMBU_SEP) -> str | None:
    """The queue a member of a kombu binding table names, or None."""
    parts = member.split(sep)
    return parts[2] if len(parts) == 3 and parts[2] else None


def registry_key(prefix: str = "belayq") -> str:
    """The registry of the queues under ``prefix`` (see :mod:`belayq.registry`): one hash,
    a field per queue, so listing queues costs O(queues) and never scans the keyspace."""
    return f"{prefix}:queues"


def owned_ready_key(kind: str, name: str, prefix: str = "belayq") -> str | None:
    """The ready list of queue ``name`` when belayq owns the keys of a queue of another
    kind (a ``belayq_dramatiq.Broker`` with ``shards``): ``<prefix>:<kind>:{<name>}``, its
    companion keys beside it (``<prefix>:<kind>:{<name>}:leases`` ...), so they never meet
    the keys of belayq's own queue of the same name. None for kind ``belayq``, whose keys
    are ``<prefix>:{<name>}:...``.

    Raises:
        ConfigError: The name holds braces.
    """
    if kind == "belayq":
        return None
    if "{" in name or "}" in name:
        raise ConfigError(f"queue name {name!r} must not contain braces")
    return f"{prefix}:{kind}:{{{name}}}"


def shard_names(name: str, shards: int) -> tuple[str, ...]:
    """The queue names of the ``shards`` shards of logical queue ``name``; each is the hash
    tag of its keys (``belayq:{<shard name>}:...``).

    One shard is the queue itself (``name``: today's layout, nothing renamed). Shard ``i`` of
    ``n > 1`` is ``name~s<j>`` for the smallest ``j`` whose slot falls within a quarter of a
    slot range around the middle of the ``i``-th of ``n`` equal ranges (``(i + 1/2) * 16384 /
    n``, +- ``16384 / 8n``). The names depend only on ``name`` and ``n``; they hash to ``n``
    distinct slots, and on a cluster whose masters hold equal contiguous slot ranges (what
    ``redis-cli --cluster create`` makes) ``n`` shards over ``m`` masters land ``n / m`` per
    master when ``m`` divides ``n`` (one per master when ``n == m``), as evenly as the
    ranges allow otherwise.

    Raises:
        ConfigError: ``shards`` is not an int within 1..MAX_SHARDS, or the name holds braces.
    """
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise ConfigError(f"shards must be an int within 1..{MAX_SHARDS}, got {shards!r}")
    if "{" in name or "}" in name:
        raise ConfigError(f"queue name {name!r} must not contain braces")
    return _shard_names(name, shards)


@functools.cache
def _shard_names(name: str, shards: int) -> tuple[str, ...]:
    if shards == 1:
        return (name,)
    width = SLOTS / shards
    half = width / 8
    names: list[str | None] = [None] * shards
    left = shards
    j = 0
    while left:
        candidate = f"{name}~s{j}"
        slot = key_slot(candidate.encode())
        i = int(slot // width)
        if abs(slot - (i + 0.5) * width) <= half and names[i] is None:
            names[i] = candidate
            left -= 1
        j += 1
    return tuple(n for n in names if n is not None)


def revocations_key(prefix: str = "belayq") -> str:
    """The sorted set of revoked ids (see :mod:`belayq.revocations`): one key for every
    queue under ``prefix`` (a revoke does not say which queue holds the message)."""
    return f"{prefix}:revoked"


def schema1_message(keys: QueueKeys, msg_id: str) -> str:
    """Where schema 1 kept the hash of message ``msg_id`` (read by the upgrade only)."""
    return f"{keys.processing[: -len('processing')]}m:{msg_id}"


def schema1_glob(keys: QueueKeys) -> str:
    """The queue's key base as a SCAN pattern prefix (glob characters escaped), for the
    upgrade from schema 1 only."""
    base = keys.processing[: -len("processing")]
    return "".join("\\" + c if c in "*?[]\\" else c for c in base)
