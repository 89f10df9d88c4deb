"""The only place a Redis key string is built.

An owned queue ``q`` under prefix ``belayq`` keeps every key under ``belayq:{q}:``; the hash
tag puts them all on one cluster slot. A queue may instead adopt an existing ready list that
other programs push to (RQ's ``rq:queue:NAME``, kombu's ``celery``): its companion keys are
then named ``{<ready key>}:...``, which hashes to the slot of the untagged ready key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.crc import key_slot

from .errors import ConfigError, CrossSlot

SCHEMA_VERSION = 1


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
        processing: List of claimed entries.
        leases: Sorted set id -> lease deadline (ms, server clock).
        delayed: Sorted set id -> due time (ms, server clock).
        dead: List of dead-lettered ids, newest first.
        stats: Hash of counters, the token sequence and the schema version.
        claimers: Sorted set consumer id -> liveness deadline (ms); guards staging lists.
        sweep_guard: String set with PX so one fleet-wide sweep runs per period.
        base: Prefix that per-message, staging and dedup keys are derived from (in Lua too).
    """

    levels: tuple[str, ...]
    processing: str
    leases: str
    delayed: str
    dead: str
    stats: str
    claimers: str
    sweep_guard: str
    base: str

    @classmethod
    def build(
        cls,
        name: str,
        *,
        prefix: str = "belayq",
        steps: int = 1,
        ready_key: str | None = None,
        level_keys: Sequence[str] | None = None,
    ) -> QueueKeys:
        """Name the keys of queue ``name``.

        Args:
            name: The queue name; must hold no braces when belayq owns the keys.
            prefix: First part of every owned key.
            steps: Number of priority levels.
            ready_key: An existing list to use as the level-0 ready list.
            level_keys: Names of the ready lists of levels 1.. when ``ready_key`` is given.

        Raises:
            ConfigError: The name or the level keys do not fit.
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
        return cls(
            levels=tuple(levels),
            processing=f"{base}processing",
            leases=f"{base}leases",
            delayed=f"{base}delayed",
            dead=f"{base}dead",
            stats=f"{base}stats",
            claimers=f"{base}claimers",
            sweep_guard=f"{base}sweep",
            base=base,
        )

    @property
    def ready(self) -> str:
        """The level-0 ready list (the BLMOVE source)."""
        return self.levels[0]

    def message(self, msg_id: str) -> str:
        """The per-message hash of ``msg_id``."""
        return f"{self.base}m:{msg_id}"

    def staging(self, consumer: str) -> str:
        """The staging list a blocking claim of ``consumer`` moves into."""
        return f"{self.base}claim:{consumer}"

    def all_fixed(self) -> tuple[str, ...]:
        """Every fixed key of the queue (not the per-message ones)."""
        return (
            *self.levels,
            self.processing,
            self.leases,
            self.delayed,
            self.dead,
            self.stats,
            self.claimers,
            self.sweep_guard,
        )

    def check_one_slot(self) -> None:
        """Refuse a layout whose keys would cross cluster slots.

        Raises:
            CrossSlot: Naming the keys and the slots they hash to.
        """
        keys = (*self.all_fixed(), self.message("x"), self.staging("x"))
        slots = {k: key_slot(k.encode()) for k in keys}
        if len(set(slots.values())) > 1:
            detail = ", ".join(f"{k!r}->{s}" for k, s in slots.items())
            raise CrossSlot(
                "this queue's keys hash to more than one Redis Cluster slot, so its scripts "
                f"cannot run on a cluster: {detail}. Put one hash tag in the ready key and "
                "name the other ready lists with the same tag."
            )
