"""Inspection and administration of a queue: stats, claims in flight and their holders,
dead letters, history, replay, purge, pause and resume, drop."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from .arguments import check_int
from .config import QueueConfig
from .constants import BELL_SCAN, PURGE_BATCH
from .errors import ConfigError
from .errors import redis_errors as _redis_errors
from .holders import Holder, host_name, parse_consumers, tag_of
from .keys import QueueKeys
from .models import DeadLetter, HistoryRecord, Lease
from .models import text as _text
from .publishing import published_ms
from .registry import Registry
from .scripts import ScriptRunner

#: The wake-up entry the scripts push into the first level (lua/includes/ready.lua).
BELL = b"\0belayq:bell"

#: The packed meta of a message (lua/includes/meta.lua).
_META = re.compile(rb"^(\d+) (\d+) (\d+) (\d+) ([01]) (\d+) (\d+) ([^|]*)\|(.*)$", re.DOTALL)


def parse_meta(packed: bytes | None) -> dict[str, Any] | None:
    """The fields of a packed meta: level, deliveries, attempts, landings lost, started,
    published ms, dead ms, token and last error; None when absent or unreadable."""
    if packed is None:
        return None
    m = _META.match(packed)
    if m is None:
        return None
    level, n, a, x, started, u, d, token, err = m.groups()
    return {
        "level": int(level),
        "deliveries": int(n),
        "attempts": int(a),
        "landings_lost": int(x),
        "started": started == b"1",
        "published_ms": int(u),
        "dead_ms": int(d),
        "token": _text(token),
        "error": _text(err),
    }


def stats_of(r: Any) -> dict[str, int]:
    """The stats script's reply as :meth:`QueueAdmin.stats` returns it."""
    names = ("ready", "in_flight", "landing", "delayed", "dead")
    out = dict(zip(names, map(int, r[:5]), strict=True))
    out["leased"] = out["in_flight"]
    out["paused"] = 0
    for i in range(5, len(r), 2):
        name = _text(r[i])
        if name == "paused":
            out["paused"], out["paused_since_ms"] = 1, int(r[i + 1])
        elif name != "schema":
            out[name] = int(r[i + 1])
    return out


class Purged(int):
    """What a purge deleted: an int (the total, as purge returned before), with the ready
    and the delayed messages apart.

    Attributes:
        ready: Ready messages deleted.
        delayed: Delayed messages deleted.
    """

    ready: int
    delayed: int

    def __new__(cls, ready: int, delayed: int) -> Purged:
        total = super().__new__(cls, ready + delayed)
        total.ready, total.delayed = ready, delayed
        return total

    def __repr__(self) -> str:
        return f"Purged(ready={self.ready}, delayed={self.delayed})"

    def __str__(self) -> str:
        return str(int(self))


class QueueAdmin:
    """Read-mostly operations of :class:`~belayq.ReliableQueue` (mixed into it)."""

    client: Any
    config: QueueConfig
    keys: QueueKeys
    kind: str
    name: str
    _scripts: ScriptRunner

    @_redis_errors
    def stats(self) -> dict[str, int]:
        """Sizes and every counter.

        ``ready``, ``in_flight`` (leases held, provisional ones included; also under its
        schema-1 name ``leased``), ``landing`` (entries between BLMOVE and their lease),
        ``delayed``, ``dead``, ``paused`` (1 while claims are paused, else 0; with
        ``paused_since_ms`` then, on the server's clock), then the counters
        (``published``, ``claimed``, ``acked``...).
        """
        return stats_of(self._scripts.run("stats"))

    @_redis_errors
    def pause(self, by: str | None = None) -> bool:
        """Pause the queue's claims: from now on no consumer is handed a message (by any
        claim, blocking or not, of any process), until :meth:`resume`. Publishing goes on,
        and so do the claims already held: their holders extend, ack, nack and release
        them as usual. An expired lease still goes back to ready, where it waits. Recorded
        in the stats (``paused``), the control history (``history_max``) and the events.

        Args:
            by: Who pauses it, for the record (default: this host and pid).

        Returns:
            True when paused now, False when it was paused already.

        Raises:
            ConfigError: A ``by`` longer than 200 bytes or holding a control character.
        """
        return bool(int(self._scripts.run("pause", self._by(by))))

    @_redis_errors
    def resume(self, by: str | None = None) -> bool:
        """Resume the claims :meth:`pause` paused: consumers waiting on the queue wake at
        once and claim as usual.

        Args:
            by: Who resumes it, for the record (default: this host and pid).

        Returns:
            True when resumed now, False when it was not paused.

        Raises:
            ConfigError: As :meth:`pause`.
        """
        return bool(int(self._scripts.run("resume", self._by(by))))

    @staticmethod
    def _by(by: str | None) -> str:
        if by is None:
            return f"{host_name()[:150]}:{os.getpid()}"
        if not isinstance(by, str):
            raise ConfigError(f"by must be a str or None, got {by!r}")
        return by

    @_redis_errors
    def in_flight(self, limit: int = 100) -> list[Lease]:
        """The claims held now, the soonest to expire first (up to ``limit``), each with
        its holder's host and pid when the holder registered them (see
        :mod:`belayq.holders`).

        Raises:
            ConfigError: A ``limit`` that is not an int >= 1.
        """
        check_int("limit", limit, minimum=1)
        rows = self.client.zrange(self.keys.leases, 0, limit - 1, withscores=True)
        ids = [_text(i) for i, _ in rows]
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.meta, ids)
        pipe.zrange(self.keys.consumers, 0, -1, withscores=True)
        metas, consumers = pipe.execute()
        holders = parse_consumers(consumers)
        out = []
        for (msg_id, (_, deadline)), packed in zip(zip(ids, rows, strict=True), metas,
                                                   strict=True):
            m = parse_meta(packed) or {}
            token = str(m.get("token", ""))
            tag = tag_of(token)
            holder = holders.get(tag) if tag else None
            out.append(Lease(
                id=msg_id, deadline_ms=int(deadline), deliveries=int(m.get("deliveries", 0)),
                attempts=int(m.get("attempts", 0)), started=bool(m.get("started", False)),
                provisional=token == "0", token=token,
                host=holder.host if holder else "", pid=holder.pid if holder else 0,
            ))  # fmt: skip
        return out

    @_redis_errors
    def holders(self, limit: int = 10_000) -> dict[str, int]:
        """How many leases each consumer holds, as ``"host:pid"`` -> count, over the
        ``limit`` soonest to expire; claims whose holder is unknown (made before it
        registered, provisional leases) count under ``""``."""
        out: dict[str, int] = {}
        for lease in self.in_flight(limit):
            key = lease.holder
            out[key] = out.get(key, 0) + 1
        return out

    @_redis_errors
    def consumers(self) -> dict[str, Holder]:
        """The consumer processes registered with the queue, by tag, newest first."""
        rows = self.client.zrevrange(self.keys.consumers, 0, -1, withscores=True)
        return parse_consumers(rows)

    @_redis_errors
    def ready_by_level(self) -> list[int]:
        """Messages waiting in each priority level's list, highest priority first (the
        bell entry not counted)."""
        pipe = self.client.pipeline(transaction=False)
        for level in self.keys.levels:
            pipe.llen(level)
        rank = 1 if self.config.ready_head == "left" else -1  # from the head end
        pipe.lpos(self.keys.levels[0], BELL, rank=rank, maxlen=BELL_SCAN)
        *lengths, bell = pipe.execute()
        if bell is not None:
            lengths[0] -= 1
        return [int(n) for n in lengths]

    @_redis_errors
    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest ``limit`` dead letters with their reasons."""
        ids = [_text(i) for i in self.client.zrevrange(self.keys.dead, 0, limit - 1)]
        if not ids:
            return []
        metas = self.client.hmget(self.keys.meta, ids)
        payloads = self.client.hmget(self.keys.payloads, ids)
        out = []
        for i, packed, payload in zip(ids, metas, payloads, strict=True):
            m = parse_meta(packed) or {}
            out.append(
                DeadLetter(
                    i,
                    payload,
                    m.get("error", ""),
                    m.get("deliveries", 0),
                    m.get("dead_ms", 0),
                    m.get("attempts", 0),
                )
            )
        return out

    @_redis_errors
    def history(self, outcome: str = "done", limit: int = 50) -> list[HistoryRecord]:
        """The newest ``limit`` messages acked (``"done"``) or dead-lettered (``"failed"``),
        or the newest pauses and resumes (``"control"``: each with outcome ``"paused"`` or
        ``"resumed"``, who did it in ``reason`` and when in ``finished_ms``), when the queue
        keeps a history (``history_max``); ``[]`` otherwise."""
        if outcome not in ("done", "failed", "control"):
            raise ConfigError(f"outcome must be 'done', 'failed' or 'control', got {outcome!r}")
        if outcome == "control":
            return self._control_history(limit)
        key = self.keys.history_done if outcome == "done" else self.keys.history_failed
        out = []
        for raw in self.client.lrange(key, 0, max(0, limit - 1)):
            head, _, payload = bytes(raw).partition(b"\n")
            h = json.loads(head)
            out.append(HistoryRecord(
                id=str(h["id"]), outcome=outcome, result=str(h.get("result", "")),
                reason=str(h.get("reason", "")), deliveries=int(h["deliveries"]),
                attempts=int(h["attempts"]),
                published_ms=int(h["published_ms"]) or published_ms(str(h["id"])),
                finished_ms=int(h["finished_ms"]), payload=payload,
            ))  # fmt: skip
        return out

    def _control_history(self, limit: int) -> list[HistoryRecord]:
        out = []
        for raw in self.client.lrange(self.keys.history_control, 0, max(0, limit - 1)):
            h = json.loads(raw)
            out.append(HistoryRecord(
                id="", outcome=str(h["action"]), result="", reason=str(h.get("by", "")),
                deliveries=0, attempts=0, published_ms=0, finished_ms=int(h["at_ms"]),
                payload=b"",
            ))  # fmt: skip
        return out

    @_redis_errors
    def replay_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """Put dead letters back on their ready lists with fresh counts: those in ``ids``,
        or, when ``ids`` is None, the oldest ``limit``. An empty ``ids`` replays nothing.
        Returns how many were replayed.

        Raises:
            ConfigError: A ``limit`` that is not an int >= 1, or ``ids`` that are not a
                sequence of non-empty str.
        """
        return self._dead_letters("replay_dead", ids, limit, discard=False)

    @_redis_errors
    def delete_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """Delete dead letters, payload and record: those in ``ids``, or, when ``ids`` is
        None, the oldest ``limit``. An empty ``ids`` deletes nothing. Returns how many were
        deleted (ids that are no dead letter are skipped).

        Raises:
            ConfigError: A ``limit`` that is not an int >= 1, or ``ids`` that are not a
                sequence of non-empty str.
        """
        return self._dead_letters("delete_dead", ids, limit, discard=True)

    def _dead_letters(self, call: str, ids: Sequence[str] | None, limit: int, *,
                      discard: bool) -> int:
        check_int("limit", limit, minimum=1)
        script = "discard" if discard else "replay"
        if ids is None:
            return int(self._scripts.run(script, limit))
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise ConfigError(f"{call}(ids=...) takes a sequence of ids, not one string")
        ids = list(ids)
        if any(not isinstance(i, str) or not i for i in ids):
            raise ConfigError(f"{call}(ids=...) takes non-empty str ids, got {ids!r}")
        if not ids:
            return 0
        return int(self._scripts.run(script, limit, *ids))

    @_redis_errors
    def purge(
        self, on_batch: Callable[[int], Any] | None = None, *, delayed: bool = True,
        on_entries: Callable[[list[bytes]], Any] | None = None,
    ) -> Purged:
        """Delete the waiting messages, in batches of 1,000 so no script holds Redis for
        long: the ready ones, and the delayed ones too unless ``delayed=False`` (a consumer
        fleet that holds delayed messages in memory, as stock Celery workers hold ETA
        tasks, never has those deleted by a purge either). Claimed messages and dead
        letters stay.

        Args:
            on_batch: Called with the count so far after each batch.
            delayed: Delete the delayed messages as well.
            on_entries: Called with each batch's purged ready list entries (RQ's job ids),
                for a framework that keeps a record per entry beside the list.

        Returns:
            :class:`Purged`: the total (an int), with ``ready`` and ``delayed`` apart.

        Raises:
            ConfigError: An ``on_batch`` or ``on_entries`` that is not callable, or
                ``delayed`` not a bool.
        """
        for name, fn in (("on_batch", on_batch), ("on_entries", on_entries)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be callable or None, got {fn!r}")
        if not isinstance(delayed, bool):
            raise ConfigError(f"delayed must be True or False, got {delayed!r}")
        ready_total = delayed_total = 0
        while True:
            reply = self._scripts.run("purge", PURGE_BATCH, "1" if delayed else "0",
                                      "0" if on_entries is None else "1")
            ready, later, more = (int(x) for x in reply[:3])
            if on_entries is not None and len(reply) > 3:
                on_entries([bytes(e) for e in reply[3:]])
            ready_total, delayed_total = ready_total + ready, delayed_total + later
            if not more or not ready + later:
                return Purged(ready_total, delayed_total)
            if on_batch is not None:
                on_batch(ready_total + delayed_total)

    @_redis_errors
    def promote_delayed(self, *, batch: int = PURGE_BATCH) -> int:
        """Make every delayed message ready now, whenever it was due (the earliest due
        first, each at the back of its ready list), ``batch`` per script call: before a
        rollback to a transport that keeps no delayed set. Returns how many.

        Raises:
            ConfigError: A ``batch`` that is not an int >= 1.
        """
        check_int("batch", batch, minimum=1)
        total = 0
        while True:
            promoted, more = (int(x) for x in self._scripts.run("promote", batch))
            total += promoted
            if not more or not promoted:
                return total

    @_redis_errors
    def drop(self) -> bool:
        """Delete the queue: its waiting messages, dead letters, counters and every key of
        its own, and its record in the registry. Refused (False, nothing deleted) while any
        message is claimed."""
        dropped = bool(int(self._scripts.run("drop")))
        if dropped:
            # Kept beside the queue's state, by the lease keeper, the dashboard and adapters.
            k = self.keys
            self.client.delete(k.rollups, k.actions, k.failures, k.failures_at)
            Registry(self.client, self.config.prefix).forget(
                self.kind, self.name, getattr(self, "namespace", ""))
            forget = getattr(self, "_observed", None)  # not written back into a dropped queue
            if forget is not None:
                forget.take()
        return dropped
