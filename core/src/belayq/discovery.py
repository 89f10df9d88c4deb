"""Finding queues for the tools (``belayq``, the dashboard, the exporter) at O(queues) cost.

A queue is known when one of these says so, and nothing else is ever taken for a queue:

* belayq's registry (:mod:`belayq.registry`): every queue a process opened, with its layout
  and limits;
* RQ's own set of its queues (``rq:queues``): an RQ queue no belayq worker has opened yet;
* kombu's binding tables of the exchanges Celery routes through (the default ``celery``
  exchange, and those belayq's transport saw bound): a queue only stock producers fill;
* for a queue asked for by name, the counters of a belayq-owned queue written by a belayq
  older than the registry.

A queue found only by its framework has no recorded limits: the tools show it, and purge
it as its framework would, but do not run its recovery pass (which would apply limits of
their own choosing). Pidbox and reply queues of Celery's remote control are never listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import RESPONSE_ERROR, ConfigError
from .keys import (
    DRAMATIQ_NAMESPACE,
    KOMBU_SEP,
    RQ_QUEUE_PREFIX,
    RQ_QUEUES,
    SHARDS_FIELD,
    QueueKeys,
    dramatiq_layout,
    kombu_binding_key,
    kombu_binding_queue,
    kombu_layout,
    rq_layout,
    rq_queue_name,
)
from .models import text as _text
from .queue import ReliableQueue
from .registry import KEPT_FIELDS, QueueRecord, Registry
from .sharded import AnyQueue, ShardedQueue
from .sharded_layout import recorded_shards

#: The kinds every belayq knows how to lay out without a record.
KNOWN_KINDS = ("belayq", "kombu", "rq", "dramatiq")

#: Celery's default exchange, through which it routes every queue it creates by name.
KOMBU_DEFAULT_EXCHANGE = "celery"


class NoQueue(ConfigError, LookupError):
    """No queue of that name (and kind) is known here."""


@dataclass(frozen=True)
class Found:
    """A queue a tool found.

    Attributes:
        kind: Who lays it out: ``belayq``, ``kombu``, ``rq`` ...
        name: Its name.
        record: What the registry keeps of it; None when only its framework knows it (or a
            belayq older than the registry wrote it).
        namespace: What sets it apart from a queue of the same kind and name (Dramatiq's
            ``namespace``, kombu's ``global_keyprefix``); ``""``: the framework's default.
    """

    kind: str
    name: str
    record: QueueRecord | None = None
    namespace: str = ""

    @property
    def recorded(self) -> bool:
        """Whether the queue's own limits are known (its recovery pass may be run)."""
        return self.record is not None


def hidden(kind: str, name: str) -> bool:
    """Whether a queue is left out of listings: Celery's remote-control (pidbox) and reply
    queues, and its event receivers, which come and go with every command."""
    return kind == "kombu" and (name.endswith(".pidbox") or name.startswith("celeryev."))


def list_queues(client: Any, prefix: str = "belayq", kind: str | None = None) -> list[Found]:
    """Every known queue (of ``kind``, when given), by kind then name: a sharded queue once,
    by its logical name.

    Costs one read of the registry, of ``rq:queues`` and of each kombu binding table read
    (Celery's default exchange and those recorded): O(queues), whatever else the database
    holds.
    """
    found: dict[tuple[str, str, str], Found] = {}
    records = Registry(client, prefix).all()
    for rec in records:
        found[(rec.kind, rec.namespace, rec.name)] = Found(rec.kind, rec.name, rec,
                                                           rec.namespace)
    if kind in (None, "rq"):
        for name in _rq_names(client):
            found.setdefault(("rq", "", name), Found("rq", name))
    if kind in (None, "kombu"):
        for keyprefix, name in _kombu_names(client, records):
            found.setdefault(("kombu", keyprefix, name), Found("kombu", name,
                                                               namespace=keyprefix))
    listed = [f for f in found.values()
              if (kind is None or f.kind == kind) and not hidden(f.kind, f.name)]
    return sorted(listed, key=lambda f: (_kind_rank(f.kind), f.name, f.namespace))


def _prefixed_hint(namespace: str | None, prefix: str) -> str:
    """How to reach a queue of a Celery app with a ``global_keyprefix``: it records its
    queues under that prefix (``<global_keyprefix><prefix>:queues``), not in a namespace of
    the registry read."""
    if not namespace or prefix.startswith(namespace):
        return ""
    return (f"; a Celery app with global_keyprefix {namespace!r} records its queues under "
            f"it: reach them with --prefix {namespace}{prefix}")


def find(client: Any, name: str, kind: str = "auto", prefix: str = "belayq",
         namespace: str | None = None) -> Found:
    """The queue called ``name`` (of ``kind``, or of whichever kind knows it; in
    ``namespace``, or in whichever namespace holds one).

    Raises:
        NoQueue: No registry, framework or belayq counter knows a queue of that name (a key
            that merely exists is never taken for a queue).
        ConfigError: ``kind="auto"`` and queues of that name exist under several kinds, or
            ``namespace`` is None and they exist in several namespaces.
    """
    registry = Registry(client, prefix)
    records = registry.all()
    kinds = sorted({*KNOWN_KINDS, *(r.kind for r in records)}, key=_kind_rank)
    if kind != "auto":
        kinds = [kind]
    hits = []
    for k in kinds:
        recs = [r for r in records if r.kind == k and r.name == name
                and namespace in (None, r.namespace)]
        hits += [Found(k, name, r, r.namespace) for r in recs]
        recorded = {r.namespace for r in recs}
        hits += [Found(k, name, namespace=ns) for ns in
                 _framework_knows(client, k, name, records, prefix)
                 if ns not in recorded and namespace in (None, ns)]
    if not hits:
        where = "any kind" if kind == "auto" else f"kind {kind}"
        raise NoQueue(f"no queue {name!r} ({where}) is known here: `belayq queues` lists them"
                      + _prefixed_hint(namespace, prefix))
    if len({h.kind for h in hits}) > 1:
        raise ConfigError(f"queues named {name!r} exist as {', '.join(h.kind for h in hits)}: "
                          "say which with --kind")
    if len(hits) > 1:
        spaces = ", ".join(repr(h.namespace) for h in hits)
        raise ConfigError(f"queues named {name!r} ({hits[0].kind}) exist in the namespaces "
                          f"{spaces}: say which with --namespace ('' is the default one)")
    return hits[0]


def open_found(client: Any, found: Found, prefix: str = "belayq") -> AnyQueue:
    """The queue, opened as recorded, without a lease keeper and writing nothing (tools
    claim nothing): its layout, its limits, its bell, and what its processes keep beside
    its messages (the history, the events), so that what a tool's action writes (a sweep's
    dead letters, a pause) is what the queue's own processes would write. A queue without a
    record is opened with its framework's layout and belayq's default limits: show it,
    purge it, never sweep it (see :attr:`Found.recorded`).

    Open it again for each request: a tool that kept the queue would apply the record as
    it stood then."""
    rec = found.record
    if rec is None:
        options = layout_of(found.kind, found.name, prefix, found.namespace)
        shards = recorded_shards(client, found.name, prefix) if found.kind == "belayq" else 1
    else:
        options = rec.options()
        options.update({f: getattr(rec, f) for f in KEPT_FIELDS
                        if getattr(rec, f) is not None})
        if rec.ready_key is None:
            options["prefix"] = prefix
        shards = rec.shards
    options.pop("kind", None)
    q: AnyQueue
    if shards > 1:
        q = ShardedQueue(client, found.name, shards=shards, keeper=False, record=False,
                         kind=found.kind, **options)
    else:
        q = ReliableQueue(client, found.name, keeper=False, kind=found.kind, record=False,
                          **options)
    q.limits_known = found.recorded
    return q


def layout_of(kind: str, name: str, prefix: str = "belayq",
              namespace: str = "") -> dict[str, Any]:
    """The :class:`~belayq.ReliableQueue` arguments of queue ``name`` of ``kind`` as its
    framework lays it out by default (kombu's default priority steps), in ``namespace``
    (kombu's key prefix).

    Raises:
        NoQueue: A kind this belayq cannot lay out without a record.
    """
    if kind == "kombu":
        return kombu_layout(name, keyprefix=namespace)
    if kind == "rq":
        return rq_layout(name)
    if kind == "dramatiq":
        return dramatiq_layout(name, namespace=namespace or DRAMATIQ_NAMESPACE)
    if kind == "belayq":
        return {"prefix": prefix}
    raise NoQueue(f"queues of kind {kind!r} are opened by their framework's belayq adapter; "
                  "this one has no record")


def _kind_rank(kind: str) -> tuple[int, str]:
    return (KNOWN_KINDS.index(kind) if kind in KNOWN_KINDS else len(KNOWN_KINDS), kind)


def _rq_names(client: Any) -> list[str]:
    names = (rq_queue_name(_text(m)) for m in _members(client, RQ_QUEUES))
    return sorted(n for n in names if n)


def _kombu_tables(records: Iterable[QueueRecord]) -> dict[str, tuple[str, str]]:
    """The binding tables to read, each with its member separator and key prefix:
    Celery's default exchange's under every key prefix recorded, and every exchange belayq's
    transport saw a queue bound to."""
    tables = {kombu_binding_key(KOMBU_DEFAULT_EXCHANGE): (KOMBU_SEP, "")}
    for rec in records:
        if rec.kind != "kombu":
            continue
        keyprefix = str(rec.facts.get("keyprefix", ""))
        sep = str(rec.facts.get("sep", KOMBU_SEP))
        for exchange in (KOMBU_DEFAULT_EXCHANGE, *rec.facts.get("exchanges", ())):
            tables.setdefault(kombu_binding_key(str(exchange), keyprefix), (sep, keyprefix))
    return tables


def _kombu_names(client: Any, records: Iterable[QueueRecord]) -> set[tuple[str, str]]:
    """The kombu queues the binding tables name, as (key prefix, name)."""
    names: set[tuple[str, str]] = set()
    for table, (sep, keyprefix) in sorted(_kombu_tables(records).items()):
        for member in _members(client, table):
            queue = kombu_binding_queue(_text(member), sep)
            if queue:
                names.add((keyprefix, queue))
    return names


def _members(client: Any, key: str) -> set[bytes]:
    """The members of a set; nothing when the key holds something else (not ours to read)."""
    try:
        return set(client.smembers(key))
    except RESPONSE_ERROR:
        return set()


def _framework_knows(client: Any, kind: str, name: str, records: list[QueueRecord],
                     prefix: str) -> set[str]:
    """The namespaces in which the framework of ``kind`` (or a belayq counter) knows a queue
    called ``name``."""
    if kind == "rq":
        return {""} if client.sismember(RQ_QUEUES, f"{RQ_QUEUE_PREFIX}{name}") else set()
    if kind == "kombu":
        return {ns for ns, n in _kombu_names(client, records) if n == name}
    if kind == "belayq":
        if "{" in name or "}" in name:
            return set()
        stats = QueueKeys.build(name, prefix=prefix).stats
        try:
            schema, _ = client.hmget(stats, ["schema", SHARDS_FIELD])
        except RESPONSE_ERROR:  # not a hash: not a belayq queue's counters
            return set()
        return {""} if schema is not None else set()
    return set()
