"""The queue registry: what every process and tool must agree on about a queue, in Redis.

Opening a queue records it in one hash per key prefix (``belayq:queues``, see
:func:`~belayq.keys.registry_key`), one field per queue (``<kind>/<name>``, or
``<kind>:<namespace>/<name>`` for a queue of a framework's non-default namespace: see
:mod:`belayq.identity`), so that any
other process or tool (the sweep of another consumer, ``belayq``, the dashboard, the
exporter) finds every queue at O(queues) cost, never by scanning the keyspace, and acts on
it with the queue's own configuration, never with defaults of its own.

A record holds two kinds of fields:

* **The layout** (:data:`LAYOUT_FIELDS`: the kind, the ready lists, priority levels, whether
  list entries are the payloads, which end is the head, the shard count). It says where the
  messages are; a process that opens the queue with another layout is refused
  (:class:`~belayq.ConfigError`): its messages would be stranded where no consumer looks.
* **The limits** (:data:`LIMIT_FIELDS`: lease, runs before the dead-letter set, the
  dead-letter cap, what happens to a message out of runs, and the bell, which decides
  whether a script may put a wake-up entry in a list stock consumers pop). A process that
  names a limit uses it, and the record keeps the values of the latest process that named
  them: a rolling restart with a new setting changes the record, with a warning in the log
  of the process that changed it, naming the old and new values; the record keeps who
  changed it and when.
  A process that names no limit takes the recorded ones (a producer that only publishes
  names none), where they fit the settings it named itself (a recorded lease no longer than
  its own heartbeat is left, with a warning: a valid configuration is never refused).
  Tools never write a record; they read it, at each request, and apply all of it.
* **What it keeps beside its messages** (:data:`KEPT_FIELDS`: the history, the events). The
  latest process that names them is recorded, as for the limits, so that the tools can say
  whether a queue keeps a history or publishes events, and apply them when they act (a
  pause from the dashboard is in the control history and sends its event, as one from the
  CLI); but each process keeps what it was opened with (a process that names none keeps
  none), and a change warns no one.

Queues that leave nothing behind on purpose (``transient``, as the Celery adapter's
remote-control reply queues) are not recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .errors import NO_PERMISSION, OUT_OF_MEMORY, ConfigError
from .identity import registry_field
from .keys import registry_key
from .models import text as _text
from .queue_record import (
    ADOPTED_FIELDS,
    KEPT_FIELDS,
    LAYOUT_FIELDS,
    LIMIT_FIELDS,
    RECORD_VERSION,
    QueueRecord,
    check_kind,
    record_of,
)

__all__ = ["ADOPTED_FIELDS", "KEPT_FIELDS", "LAYOUT_FIELDS", "LIMIT_FIELDS", "RECORD_VERSION",
           "QueueRecord", "Registry", "check_kind", "check_layout", "record_of",
           "record_or_warn"]

log = logging.getLogger("belayq")

#: Deletes a field of the registry only while it still holds the bytes read (ARGV[2]), in
#: one step: moving a record an earlier belayq wrote never deletes a record another process
#: wrote there meanwhile (as redis-py's ``Lock`` releases only its own token).
#: KEYS[1] the registry hash; ARGV[1] the field; ARGV[2] the bytes read. Returns 1 when
#: deleted, else 0.
_DELETE_IF_UNCHANGED = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


class Registry:
    """The registry of the queues under one key prefix, on one client.

    Args:
        client: A redis-py client (or cluster client) with ``decode_responses=False``.
        prefix: The key prefix (``QueueConfig.prefix``).
    """

    def __init__(self, client: Any, prefix: str = "belayq") -> None:
        self.client = client
        self.key = registry_key(prefix)

    def get(self, kind: str, name: str, namespace: str = "") -> QueueRecord | None:
        """The record of queue ``name`` of ``kind`` in ``namespace``, or None (one an
        earlier belayq wrote under ``<kind>/<name>`` is found too)."""
        field = registry_field(kind, name, namespace)
        raw = self.client.hget(self.key, field)
        rec = None if raw is None else _readable(raw)
        if rec is not None and rec.field == field:  # not another namespace's, of the old form
            return rec
        return self._earlier(kind, name, namespace)

    def _earlier(self, kind: str, name: str, namespace: str) -> QueueRecord | None:
        """The record an earlier belayq wrote for a queue of a non-default ``namespace``
        under the field of the default one, or None."""
        found = self._earlier_read(kind, name, namespace)
        return None if found is None else found[0]

    def _earlier_read(self, kind: str, name: str,
                      namespace: str) -> tuple[QueueRecord, bytes] | None:
        """:meth:`_earlier`, with the bytes it was read from."""
        if not namespace:
            return None
        raw = self.client.hget(self.key, registry_field(kind, name))
        rec = None if raw is None else _readable(raw)
        return (rec, raw) if rec is not None and rec.namespace == namespace else None

    def _delete_if_unchanged(self, field: str, raw: bytes) -> None:
        """Delete ``field`` only if it still holds ``raw`` (in one step, on the server)."""
        self.client.register_script(_DELETE_IF_UNCHANGED)(keys=[self.key], args=[field, raw])

    def all(self) -> list[QueueRecord]:
        """Every record, by kind, name and namespace (records this belayq cannot read are
        left out), each queue once: a record an earlier belayq wrote under the field of the
        default namespace is listed under its own."""
        out: dict[str, QueueRecord] = {}
        moved = []
        for stored, raw in self.client.hgetall(self.key).items():
            rec = _readable(raw)
            if rec is None:
                continue
            if rec.field == _text(stored):
                out[rec.field] = rec
            else:
                moved.append(rec)
        for rec in moved:
            out.setdefault(rec.field, rec)
        return sorted(out.values(), key=lambda r: (r.kind, r.name, r.namespace))

    def record(self, rec: QueueRecord) -> QueueRecord:
        """Record ``rec`` (a process opening the queue), and return what now stands: the
        limits ``rec`` names replace the recorded ones (with a warning when another process
        had named them otherwise); the others stay as recorded (see the module doc).

        A record an earlier belayq wrote under ``<kind>/<name>`` for a queue of another
        namespace moves to its own field; one it wrote for this queue is taken as this
        queue's, and moves to this queue's field. The old field is deleted only while it
        still holds the record read (one step on the server), never a record another process
        wrote there meanwhile.

        On a full server (``maxmemory`` under ``noeviction``) the write is refused: what
        would stand is returned all the same, with a warning, so that a queue can always be
        opened to drain it; the record is written by the next process that opens the queue
        once there is room. The layout is checked against the record first, full or not.

        Raises:
            ConfigError: The queue is recorded with another layout.
        """
        for _ in range(3):
            raw = self.client.hget(self.key, rec.field)
            old = None if raw is None else _readable(raw)
            if raw is not None and old is None:  # written by another belayq version: left
                return rec
            if old is not None and old.field != rec.field:
                try:  # an earlier belayq's record of another namespace's queue: its own now
                    self.client.hsetnx(self.key, old.field, old.to_json())
                    self._delete_if_unchanged(rec.field, raw)
                except OUT_OF_MEMORY as exc:
                    return _unwritten(self.key, rec, exc)
                continue
            read = self._earlier_read(rec.kind, rec.name, rec.namespace) if old is None else None
            earlier = None if read is None else read[0]
            if old is None and earlier is None:
                try:
                    if self.client.hsetnx(self.key, rec.field, rec.to_json()):
                        return rec
                except OUT_OF_MEMORY as exc:
                    return _unwritten(self.key, rec, exc)
                continue  # another process recorded it meanwhile: compare with that
            stood = old if old is not None else earlier
            assert stood is not None
            check_layout(stood, rec)
            new = _merged_record(stood, rec)
            if new is stood and earlier is None:
                return stood
            try:
                self.client.hset(self.key, rec.field, new.to_json())
                if read is not None:  # unless another process wrote that field meanwhile
                    self._delete_if_unchanged(registry_field(rec.kind, rec.name), read[1])
            except OUT_OF_MEMORY as exc:
                return _unwritten(self.key, new, exc)
            return new
        raise ConfigError(f"could not record queue {rec.name!r}: the registry kept changing")

    def note_facts(self, kind: str, name: str, facts: Mapping[str, Any],
                   namespace: str = "") -> None:
        """Add what a framework needs to find a recorded queue again (lists are joined)."""
        rec = self.get(kind, name, namespace)
        if rec is None:
            return
        merged = _merged(rec.facts, facts)
        if merged != dict(rec.facts):
            self.client.hset(self.key, rec.field, replace(rec, facts=merged).to_json())

    def forget(self, kind: str, name: str, namespace: str = "") -> bool:
        """Remove the record of a queue (it was dropped), wherever an earlier belayq put
        it."""
        fields = [registry_field(kind, name, namespace)]
        if self._earlier(kind, name, namespace) is not None:
            fields.append(registry_field(kind, name))
        return bool(self.client.hdel(self.key, *fields))


def _merged_record(old: QueueRecord, rec: QueueRecord) -> QueueRecord:
    """What stands once ``rec`` is recorded over ``old`` (``old`` itself when nothing
    changes): the limits ``rec`` names, and the fields ``old`` was written without."""
    changed = {f: (getattr(old, f), getattr(rec, f)) for f in rec.named
               if getattr(old, f) != getattr(rec, f)}
    # A record written before these fields were recorded learns them now.
    changed.update({f: (None, getattr(rec, f)) for f in (*KEPT_FIELDS, "bell")
                    if getattr(old, f) is None and f not in changed})
    named = tuple(sorted(set(old.named) | set(rec.named)))
    if not changed and named == old.named:
        return old
    new = replace(old, named=named, **{f: b for f, (_, b) in changed.items()})
    if any(f in LIMIT_FIELDS for f in changed):
        new = replace(new, changed_ms=rec.changed_ms, changed_by=rec.changed_by)
        loud = {f: ab for f, ab in changed.items() if f in old.named and f in LIMIT_FIELDS}
        if loud:
            _warn_changed(rec, old, loud)
    return new


def record_or_warn(registry: Registry, rec: QueueRecord) -> QueueRecord:
    """:meth:`Registry.record`, or, when the ACL refuses the registry key, ``rec`` itself
    with a warning (once per registry key and process): the queue works, but the tools do
    not find it and other processes do not learn its limits."""
    try:
        return registry.record(rec)
    except NO_PERMISSION as exc:
        if registry.key not in _REFUSED:
            _REFUSED.add(registry.key)
            log.warning(
                "cannot record queue %r in belayq's registry %r (%s): the tools will not list "
                "it and other processes will not learn its limits. Allow the key to this "
                "ACL user (docs/acl.md).", rec.name, registry.key, exc)
        return rec


#: Registry keys an ACL refused in this process (warned about once).
_REFUSED: set[str] = set()

#: The records a full server refused in this process, as (registry key, field): warned once.
_FULL: set[tuple[str, str]] = set()


def _unwritten(key: str, standing: QueueRecord, exc: BaseException) -> QueueRecord:
    """``standing``, which a full server refused to store, with a warning (once per queue
    and process): the queue opens, and drains, with the values it would have recorded."""
    if (key, standing.field) not in _FULL:
        _FULL.add((key, standing.field))
        log.warning(
            "queue %r (%s): the Redis server is full (%s), so its record in belayq's registry "
            "%r was not written; the queue opens with %s, and the record is written by the "
            "next process that opens it once there is memory again.", standing.name,
            standing.kind, exc, key,
            ", ".join(f"{f}={getattr(standing, f)!r}" for f in LIMIT_FIELDS))
    return standing


def _merged(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Facts of two records together: lists are joined (kombu's exchanges), the rest is
    the newer value."""
    out = dict(old)
    for k, v in new.items():
        if isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = sorted(set(out[k]) | set(v))
        else:
            out[k] = v
    return out


def _warn_changed(rec: QueueRecord, old: QueueRecord, changed: dict[str, tuple[Any, Any]]) -> None:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(old.changed_ms / 1000))
    log.warning(
        "queue %r (%s): %s (recorded since %s by %s). Tools and processes that open it from "
        "now on apply the new value; processes started before keep theirs until they "
        "restart.", rec.name, rec.kind,
        ", ".join(f"{f} {a!r} -> {b!r}" for f, (a, b) in changed.items()), since,
        old.changed_by or "another process")


def _readable(raw: bytes | str) -> QueueRecord | None:
    try:
        return QueueRecord.from_json(raw)
    except (ValueError, TypeError, KeyError):
        log.warning("the queue registry holds a record this belayq cannot read: %r",
                    raw[:200])
        return None


def check_layout(old: QueueRecord, new: QueueRecord) -> None:
    """Refuse ``new`` when it lays out the queue of ``old`` otherwise.

    Raises:
        ConfigError: A layout field differs.
    """
    diff = [f for f in LAYOUT_FIELDS if getattr(old, f) != getattr(new, f)]
    if diff:
        shown = "; ".join(f"{f}: recorded {getattr(old, f)!r}, asked {getattr(new, f)!r}"
                          for f in diff)
        raise ConfigError(
            f"queue {new.name!r} ({new.kind}) is laid out otherwise than this process asks "
            f"({shown}). Its messages are where the record says: open it that way. To lay "
            f"it out anew, shut its processes down, drain it, and `belayq drop` it first."
        )
