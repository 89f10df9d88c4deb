"""One queue's record in the registry (:mod:`belayq.registry`): what every process and
tool must agree on about it, and its stored JSON form."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .config import QueueConfig
from .errors import ConfigError
from .identity import namespace_of, registry_field

#: Version of a record's JSON form.
RECORD_VERSION = 1

#: Kinds are short names (belayq's own queues are ``belayq``; the adapters name theirs).
_KIND = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

#: Fields that say where a queue's messages are; they never change while it exists.
LAYOUT_FIELDS = ("ready_key", "level_keys", "priority_steps", "payload_in_list", "ready_head",
                 "shards", "payloads_key")
#: Fields that say how a queue treats its messages; the latest process that names them wins.
LIMIT_FIELDS = ("lease_ms", "max_deliveries", "dead_letter_max", "exhausted", "bell")
#: The fields a process that names none of them takes from the record.
ADOPTED_FIELDS = LIMIT_FIELDS
#: Fields that say what a queue's processes keep beside its messages; recorded for the tools.
KEPT_FIELDS = ("history_max", "history_ttl_ms", "events")


def check_kind(kind: str) -> str:
    """``kind``, checked: a short lower-case name.

    Raises:
        ConfigError: Another value.
    """
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise ConfigError(f"kind must be a short lower-case name such as 'belayq', got {kind!r}")
    return kind


@dataclass(frozen=True)
class QueueRecord:
    """What the registry keeps of one queue.

    Attributes:
        kind: ``belayq`` (a queue belayq owns), ``kombu``, ``rq`` ...: who lays it out.
        name: The queue's name within its kind.
        ready_key: The ready list of an adopted queue (RQ's ``rq:queue:NAME``, kombu's
            ``celery``); None when belayq owns the keys.
        level_keys: The lower priority levels' lists of an adopted queue.
        priority_steps: The priority levels.
        payload_in_list: Whether list entries are the payloads.
        ready_head: Which end of the lists is claimed next.
        shards: How many shards a :class:`~belayq.ShardedQueue` spreads it over.
        lease_ms: The lease its consumers take.
        max_deliveries: Runs after which a failed message is dead-lettered.
        dead_letter_max: The cap of its dead-letter set.
        exhausted: What happens to a message out of runs (``dead`` or ``deliver``).
        history_max: How many finished messages of each outcome its processes keep (0: no
            history); None when its record was written by a belayq that did not record it.
        history_ttl_ms: How long a history list is kept after its last write (ms); None as
            for ``history_max``.
        events: Whether its processes publish events; None as for ``history_max``.
        bell: Whether the scripts may ring the priority bell in its first list (off while
            stock consumers pop the same lists); None as for ``history_max``.
        payloads_key: The payloads hash of an adopted queue that keeps its payloads in its
            framework's own hash (Dramatiq's ``<list>.msgs``); None for the queue's own.
        namespace: What sets it apart from a queue of the same kind and name on the same
            server (Dramatiq's ``namespace``, kombu's ``global_keyprefix``, when not the
            framework's default); ``""`` in the default one.
        named: The limits (and kept fields) some process named itself (the others are
            belayq's defaults, which a process naming them sets without a warning).
        facts: What its framework needs to find it again (kombu: the key prefix and the
            exchanges its lists are bound to).
        changed_ms: When the limits were last set (ms since the epoch, this host's clock).
        changed_by: ``host:pid`` of the process that set them.
    """

    kind: str
    name: str
    ready_key: str | None
    level_keys: tuple[str, ...]
    priority_steps: tuple[int, ...]
    payload_in_list: bool
    ready_head: str
    shards: int
    lease_ms: int
    max_deliveries: int
    dead_letter_max: int
    exhausted: str
    history_max: int | None = None
    history_ttl_ms: int | None = None
    events: bool | None = None
    bell: bool | None = None
    payloads_key: str | None = None
    namespace: str = ""
    named: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    changed_ms: int = 0
    changed_by: str = ""

    @property
    def field(self) -> str:
        """The registry hash field of this queue."""
        return registry_field(self.kind, self.name, self.namespace)

    def options(self) -> dict[str, Any]:
        """The :class:`~belayq.ReliableQueue` keyword arguments that open this queue as
        recorded (``shards`` apart)."""
        out: dict[str, Any] = {f: getattr(self, f) for f in LIMIT_FIELDS
                               if getattr(self, f) is not None}
        out.update(priority_steps=self.priority_steps, payload_in_list=self.payload_in_list,
                   ready_head=self.ready_head)
        if self.ready_key is not None:
            out.update(ready_key=self.ready_key, level_keys=list(self.level_keys))
        if self.payloads_key is not None:
            out["payloads_key"] = self.payloads_key
        if self.namespace:
            out["namespace"] = self.namespace
        return out

    def to_json(self) -> str:
        body = asdict(self)
        body["version"] = RECORD_VERSION
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> QueueRecord:
        """A record from its stored form.

        Raises:
            ValueError: Not a record this belayq can read.
        """
        body = json.loads(raw)
        if not isinstance(body, dict) or body.pop("version", None) != RECORD_VERSION:
            raise ValueError("not a belayq queue record")
        known = {f.name for f in fields(cls)}
        body = {k: v for k, v in body.items() if k in known}
        body["level_keys"] = tuple(body.get("level_keys") or ())
        body["priority_steps"] = tuple(body["priority_steps"])
        body["named"] = tuple(body.get("named") or ())
        if "namespace" not in body:  # written by an earlier belayq: its ready list says
            body["namespace"] = namespace_of(body["kind"], body["name"], body.get("ready_key"),
                                             body.get("payloads_key"))
        return cls(**body)


def record_of(kind: str, name: str, config: QueueConfig, *, ready_key: str | None,
              level_keys: Iterable[str], named: Iterable[str] = (), shards: int = 1,
              facts: Mapping[str, Any] | None = None,
              payloads_key: str | None = None, namespace: str = "") -> QueueRecord:
    """The record of a queue opened with ``config``; ``named``: the limits the opener
    named itself."""
    return QueueRecord(
        kind=kind, name=name, ready_key=ready_key, level_keys=tuple(level_keys),
        priority_steps=config.priority_steps, payload_in_list=config.payload_in_list,
        ready_head=config.ready_head, shards=shards, lease_ms=config.lease_ms,
        max_deliveries=config.max_deliveries, dead_letter_max=config.dead_letter_max,
        exhausted=config.exhausted, history_max=config.history_max,
        history_ttl_ms=config.history_ttl_ms, events=config.events, bell=config.bell,
        payloads_key=payloads_key, namespace=namespace,
        named=tuple(sorted(set(named) & {*LIMIT_FIELDS, *KEPT_FIELDS})),
        facts=dict(facts or {}),
        changed_ms=int(time.time() * 1000), changed_by=f"{socket.gethostname()}:{os.getpid()}",
    )
