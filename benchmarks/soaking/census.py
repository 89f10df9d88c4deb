"""The census of a server's keys at the end of a soak: every key, grouped by pattern, and
each group classified as kept on purpose within a documented cap (named, and checked), or
as a LEAK: a key or a record that outlives its message without such a cap.

Only the soak's own server is scanned (SCAN over a few thousand keys, once, at the end:
never a hot path)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from belayq import failures, rollups
from belayq.constants import CONSUMERS_KEPT
from belayq.discovery import list_queues, open_found
from belayq.models import text
from belayq.sharded import parts_of
from belayq.web.console import ACTIONS_KEPT

DAY_MS = 24 * 3600 * 1000


@dataclass
class Key:
    name: str
    pattern: str
    type: str
    pttl: int  # ms; -1 none
    size: int  # elements (a string: 1)
    memory: int  # bytes (MEMORY USAGE)
    #: a hash's fields or a set's members, by pattern (the first SAMPLED of them)
    members: Counter[str] = field(default_factory=Counter)


@dataclass
class Group:
    pattern: str
    keys: list[Key] = field(default_factory=list)
    verdict: str = "LEAK"
    cap: str = ""
    why: str = ""

    @property
    def memory(self) -> int:
        return sum(k.memory for k in self.keys)

    def to_json(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "keys": len(self.keys), "memory": self.memory,
                "elements": sum(k.size for k in self.keys), "verdict": self.verdict,
                "cap": self.cap, "why": self.why,
                "max_ttl_s": max((round(k.pttl / 1000) for k in self.keys), default=-1),
                "examples": [k.name for k in self.keys[:3]],
                "members": dict(sum((k.members for k in self.keys), Counter()).most_common(5))}


def normalise(name: str, queues: dict[str, str]) -> str:
    """``name`` with the soak's queue names, task ids, worker names, uuids and numbers
    replaced by placeholders, so keys of one kind share one pattern."""
    out = name
    for framework, q in queues.items():
        out = out.replace(q, f"<{framework} queue>")
    out = re.sub(r"sk-[crd]\d+", "<task>", out)
    out = re.sub(r"soakw-[a-z]+-\d+-[0-9a-f]+", "<worker>", out)
    out = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", out)
    out = re.sub(r"[0-9a-f]{32,40}", "<hex>", out)
    return re.sub(r"\d+", "<n>", out)


#: How many members of a hash, set or sorted set are read to name their patterns.
SAMPLED = 200
MEMBERS = {"hash": "hscan", "set": "sscan", "zset": "zscan"}
SIZE = {"hash": "hlen", "list": "llen", "zset": "zcard", "set": "scard", "stream": "xlen"}


def scan(r: redis.Redis, queues: dict[str, str]) -> list[Key]:
    keys = []
    for raw in r.scan_iter(count=1000):
        name = raw.decode(errors="backslashreplace") if isinstance(raw, bytes) else str(raw)
        kind = text(r.type(raw))
        if kind == "none":
            continue  # expired meanwhile
        size = int(getattr(r, SIZE[kind])(raw)) if kind in SIZE else 1
        key = Key(name, normalise(name, queues), kind, int(r.pttl(raw)), size,
                  int(r.memory_usage(raw, samples=0) or 0))
        if kind in MEMBERS:
            found = getattr(r, MEMBERS[kind])(raw, count=SAMPLED)[1]
            names = found.keys() if isinstance(found, dict) else (
                m[0] if isinstance(m, tuple) else m for m in found)
            key.members.update(normalise(text(m), queues) for m in list(names)[:SAMPLED])
        keys.append(key)
    return keys


Check = Callable[[Key, "Context"], str | None]  # why the key is over its cap, or None


@dataclass
class Context:
    """What the checks need beyond the key itself."""

    rq_failed: frozenset[str] = frozenset()  # the job ids in RQ's failed registries
    #: memo hash -> its fields that have no expiry in its ``:exp`` set
    memo_unexpiring: dict[str, int] = field(default_factory=dict)
    #: history list -> the ``history_max`` its queue recorded
    history_max: dict[str, int] = field(default_factory=dict)
    #: lead key -> the ``lease_ms`` its queue recorded
    lease_ms: dict[str, int] = field(default_factory=dict)


def at_most(n: int, ttl_ms: int | None = None) -> Check:
    def check(k: Key, ctx: Context) -> str | None:
        if k.size > n:
            return f"{k.name}: {k.size} elements, over {n}"
        if ttl_ms is not None and not 0 < k.pttl <= ttl_ms:
            return f"{k.name}: TTL {k.pttl} ms, not within {ttl_ms} ms"
        return None
    return check


def ttl_within(ttl_ms: int) -> Check:
    return at_most(2**62, ttl_ms)


def context(r: redis.Redis) -> Context:
    failed: set[str] = set()
    for key in r.scan_iter(match="rq:failed:*", count=1000):
        failed.update(text(m) for m in r.zrange(key, 0, -1))
    unexpiring: dict[str, int] = {}
    for key in r.scan_iter(match="*:memo", count=1000):
        fields = {text(f) for f in r.hkeys(key)}
        expiring = {text(m) for m in r.zrange(text(key) + ":exp", 0, -1)}
        unexpiring[text(key)] = len(fields - expiring)
    history: dict[str, int] = {}
    lease: dict[str, int] = {}
    for found in list_queues(r):
        for part in parts_of(open_found(r, found)):
            for key in (part.keys.history_done, part.keys.history_failed,
                        part.keys.history_control):
                history[key] = part.config.history_max
            lead = getattr(part.keys, "lead", None)
            if lead is not None:
                lease[lead] = part.config.lease_ms
    return Context(rq_failed=frozenset(failed), memo_unexpiring=unexpiring,
                   history_max=history, lease_ms=lease)


def anything(k: Key, ctx: Context) -> str | None:
    return None


def memo_expires(k: Key, ctx: Context) -> str | None:
    """A reply memo: each field has its expiry in the ``:exp`` set, which the scripts
    enforce (the next sweep drops it)."""
    if ctx.memo_unexpiring.get(k.name):
        return f"{k.name}: {ctx.memo_unexpiring[k.name]} fields with no expiry"
    return None


def recorded_history(k: Key, ctx: Context) -> str | None:
    """A history list: at most the ``history_max`` its queue recorded."""
    cap = ctx.history_max.get(k.name)
    if cap is None:
        return f"{k.name}: no queue on record keeps it"
    return f"{k.name}: {k.size} records, over history_max={cap}" if k.size > cap else None


def recorded_lease(k: Key, ctx: Context) -> str | None:
    """A queue's lead: it expires a lease (as its queue recorded it) after its last renewal."""
    lease = ctx.lease_ms.get(k.name)
    if lease is None:
        return f"{k.name}: no queue on record leads with it"
    return None if 0 < k.pttl <= lease else f"{k.name}: PTTL {k.pttl} ms, lease {lease} ms"


def rq_job_record(k: Key, ctx: Context) -> str | None:
    """An RQ job's hash or results: kept while RQ keeps the job (it expires with
    result_ttl, or the job is in a failed registry, whose cleanup deletes it with its
    results after failure_ttl)."""
    if 0 < k.pttl <= 366 * DAY_MS or k.name.rsplit(":", 1)[1] in ctx.rq_failed:
        return None
    return f"{k.name}: TTL {k.pttl} ms and its job is in no failed registry"


#: (pattern regex, cap named, check). A key matching none is a LEAK; so is one over its cap.
KEPT: list[tuple[str, str, Check]] = [
    # belayq's own records, one key per queue (or per prefix), never one per message
    (r"^belayq:queues$", "registry: one field per queue", anything),
    (r":stats$", "the queue's counters: one hash per queue, fixed fields", anything),
    (r":observed$", "the consumers' histograms: one hash per queue, fixed buckets", anything),
    (r":rollups$", f"per-minute history: {rollups.KEEP_MINUTES} minutes (+{rollups.TRIM_SLACK}),"
     " expires a day after its last write",
     at_most(rollups.KEEP_MINUTES + rollups.TRIM_SLACK,
             (rollups.KEEP_MINUTES + rollups.TRIM_SLACK) * rollups.MINUTE_MS)),
    (r":actions$", f"the console's action log: newest {ACTIONS_KEPT}", at_most(ACTIONS_KEPT)),
    (r":history:(done|failed|control)$", "history lists: the history_max their queue recorded",
     recorded_history),
    (r":failures(:at)?$", f"failed runs: newest {failures.KEPT}, expire "
     f"{failures.KEEP_MS // DAY_MS} days after the last failure",
     at_most(failures.KEPT, failures.KEEP_MS)),
    (r":consumers$", f"consumer processes: newest {CONSUMERS_KEPT}", at_most(CONSUMERS_KEPT)),
    (r":lead$", "the queue's lead (which worker lists its delayed messages): expires a lease "
     "after its last renewal", recorded_lease),
    (r":memo(:exp)?$", "reply memos: entries of the last reply window, each with its expiry",
     memo_expires),
    (r":unpaused$", "the bell of a resumed queue: one element per queue", at_most(1)),
    (r"^_kombu\.binding(\.|_deadlines$|_permanent\.)",
     "kombu's binding tables and their expiry records: one per exchange", anything),
    # RQ's own keys, as stock RQ keeps them
    (r"^rq:queues$", "RQ's set of queues", anything),
    (r"^rq:workers(:<rq queue>)?$", "RQ's live workers (pruned by RQ's maintenance)",
     anything),
    (r"^rq:worker:<worker>$", "an RQ worker's record: expires with worker_ttl",
     ttl_within(60_000)),
    (r"^rq:(finished|failed|wip|scheduled|deferred|canceled):<rq queue>$",
     "RQ's registries of the jobs RQ keeps (their job hashes are checked below)", anything),
    (r"^rq:(job|results):<task>$", "a job RQ keeps: result_ttl (500 s) when finished; "
     "while in a failed registry (failure_ttl, 1 year) when failed", rq_job_record),
    (r"^rq:scheduler-lock:<rq queue>$", "RQ's scheduler lock: expires", ttl_within(120_000)),
    (r"^rq:clean_registries:<rq queue>$", "RQ's maintenance lock: expires", ttl_within(900_000)),
    (r"^rq:scheduler_instance:", "RQ's scheduler record: expires", ttl_within(900_000)),
]


def classify(keys: list[Key], ctx: Context) -> list[Group]:
    """Group ``keys`` by pattern and judge each group against its cap."""
    groups: dict[str, Group] = {}
    for k in keys:
        groups.setdefault(k.pattern, Group(k.pattern)).keys.append(k)
    for g in groups.values():
        for pattern, cap, check in KEPT:
            if re.search(pattern, g.pattern):
                over = [why for why in (check(k, ctx) for k in g.keys) if why]
                g.cap = cap
                if over:
                    g.verdict, g.why = "LEAK", f"over its cap: {over[0]}"
                else:
                    g.verdict = "kept"
                break
        else:
            g.why = "no documented cap: it outlives its messages"
    return sorted(groups.values(), key=lambda g: (g.verdict != "LEAK", g.pattern))


def _dumps(r: redis.Redis) -> dict[bytes, tuple[bytes, int]]:
    """Every key's DUMP and PTTL, read together (MULTI): a key that expires between the two
    is absent, never a value without its TTL."""
    out = {}
    for key in r.scan_iter(count=1000):
        pipe = r.pipeline(transaction=True)
        pipe.dump(key)
        pipe.pttl(key)
        value, pttl = pipe.execute()
        if value is not None:
            out[bytes(key)] = (bytes(value), int(pttl))
    return out


def writes_during(r: redis.Redis, read: Callable[[], Any]) -> dict[str, list[str]]:
    """The keys created, changed or deleted while ``read`` ran (every key DUMPed before and
    after; a key that might have expired meanwhile is left out). Only on a server nothing
    else writes to."""
    t0 = time.monotonic()
    before = _dumps(r)
    read()
    after = _dumps(r)
    window_ms = (time.monotonic() - t0 + 1) * 1000

    def may_expire(key: bytes) -> bool:
        return 0 <= before[key][1] <= window_ms

    return {
        "created": sorted(text(k) for k in after.keys() - before.keys()),
        "changed": sorted(text(k) for k in after.keys() & before.keys()
                          if after[k][0] != before[k][0]),
        "deleted": sorted(f"{text(k)} (PTTL {before[k][1]} ms, {window_ms:.0f} ms read)"
                          for k in before.keys() - after.keys() if not may_expire(k)),
    }


def memory(r: redis.Redis) -> dict[str, int]:
    info = r.info("memory")
    names = ("used_memory", "used_memory_dataset", "used_memory_overhead", "mem_clients_normal",
             "used_memory_scripts", "used_memory_vm_eval", "used_memory_scripts_eval",
             "used_memory_vm_functions", "used_memory_functions")
    stats = r.memory_stats()
    tables = sum(int(v.get("overhead.hashtable.main", 0)) + int(v.get(
        "overhead.hashtable.expires", 0)) for k, v in stats.items()
        if k.startswith("db.") and isinstance(v, dict))
    return {n: int(info.get(n, 0)) for n in names} | {
        "dbsize": int(r.dbsize()), "overhead_hashtables": tables, "t": int(time.time())}


#: What :func:`decompose` frees, in order, and how.
PARTS: tuple[tuple[str, Callable[[redis.Redis], Any]], ...] = (
    ("keys", lambda r: r.flushall()),
    ("slow log", lambda r: r.slowlog_reset()),
    ("script cache", lambda r: r.script_flush()),
    ("function cache", lambda r: r.function_flush()),
    # Redis 7 keeps a latency histogram per command name run since the last reset
    ("per-command statistics", lambda r: r.config_resetstat()),
)


def held(r: redis.Redis) -> int:
    """``used_memory`` without the clients' buffers (the soak's own connection's vary with
    the replies it reads)."""
    info = r.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


def decompose(r: redis.Redis) -> dict[str, int]:
    """How much of ``used_memory`` (without the clients' buffers) each part of the server's
    state holds (bytes freed when it goes), and what is left once all have gone (``left``).
    Destructive: only for the soak's own server, at its end, after the census."""
    out: dict[str, int] = {}
    before = held(r)
    for label, free in PARTS:
        free(r)
        after = held(r)
        out[label], before = before - after, after
    out["left"] = before
    return out


def memory_stats(r: redis.Redis) -> dict[str, Any]:
    """MEMORY STATS, flattened (for the JSON report)."""
    out: dict[str, Any] = {}
    for k, v in r.memory_stats().items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out
