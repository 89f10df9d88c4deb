"""The model of tests/core/test_model.py: what belayq's key schema 2 holds after each call.

``Model`` keeps every structure of a queue in the shape of its Redis key (ready levels,
landing zone, leases, delayed, dead, meta, payloads, memo, memo:exp, stats) and has one
method per script, written from the contract blocks of core/src/belayq/lua. ``observe``
reads a queue's keys back; ``contract_problems`` checks what must hold on Redis whatever
the model thinks; ``Model.expected`` is what ``observe`` must return exactly.

Time: the scripts read the server clock plus ``skew_ms``. The model counts in ticks of
``TICK_MS`` (far longer than any example runs) and only moves by whole ticks, so whether a
lease expired, a delay is due or a memo record expired never depends on this machine's
speed. A time a script wrote (a score, a meta's published/dead ms) is a ``Stamp``: the
model knows its offset (the call's skew plus the duration) and reads the value back after
the call, checking that it lies inside the call's window of server time.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from belayq.admin import parse_meta

TICK_MS = 1_000_000
LEASE_TICKS = 2
DEDUP_TICKS = 2  # a dedup id holds for the tick of its publish and this many more
BELL = "\0belayq:bell"  # ready.lua's wake-up entry (level 1 and the landing zone only)
SWEEP_LIMIT = 1000  # ReliableQueue.sweep() passes this bound
PURGE_LIMIT = 1000  # QueueAdmin.purge() batch


def window_ms(ticks: int) -> int:
    """A memo window that expires exactly ``ticks + 1`` ticks after the write."""
    return ticks * TICK_MS + TICK_MS // 2


def inline_id(entry: bytes) -> str:
    """ids.lua's id_of in inline mode: short printable ASCII is its own id, else SHA1."""
    if len(entry) > 64 or not entry or any(not 0x21 <= c <= 0x7E for c in entry):
        return hashlib.sha1(entry).hexdigest()
    return entry.decode("ascii")


def pack(parts: Iterable[str]) -> bytes:
    return "".join(f"{len(p)}:{p}" for p in parts).encode()


def unpack(packed: bytes) -> list[str]:
    out, pos, s = [], 0, packed.decode()
    while pos < len(s):
        colon = s.index(":", pos)
        n = int(s[pos:colon])
        out.append(s[colon + 1 : colon + 1 + n])
        pos = colon + 1 + n
    return out


@dataclass
class Stamp:
    """A server time a script wrote: value - offset must lie in the call's window."""

    offset: int  # the call's skew + the duration added (ms)
    due: int = 0  # the tick from which it is due (a lease, a delay) or expired (memo)
    value: int | None = None  # read back after the call

    def order(self, member: str) -> tuple[int, int, str]:
        """ZRANGE order: by score, ties by member; an unread stamp was written by the
        current call, later than every stamp already read back."""
        return (0, self.value, member) if self.value is not None else (1, 0, member)


def _ms(v: Stamp | int) -> int | None:
    return v.value if isinstance(v, Stamp) else v


@dataclass
class Meta:
    """meta.lua's packed state, field for field."""

    level: int
    n: int = 0  # deliveries
    a: int = 0  # attempts (started runs)
    x: int = 0  # landings lost
    s: bool = False  # the current claim started
    u: Stamp | int = 0  # published ms (a delayed publish's now, else 0)
    d: Stamp | int = 0  # dead ms (the same Stamp as its dead score)
    t: str = ""  # token: '' not held, '0' provisional
    e: str = ""  # last error

    def blank(self) -> bool:
        return self.n == 0 and self.a == 0 and self.x == 0 and self.e == ""

    def parsed(self) -> dict[str, Any]:
        """As admin.parse_meta reads it back."""
        return {
            "level": self.level,
            "deliveries": self.n,
            "attempts": self.a,
            "landings_lost": self.x,
            "started": self.s,
            "published_ms": _ms(self.u),
            "dead_ms": _ms(self.d),
            "token": self.t,
            "error": self.e,
        }


@dataclass
class Config:
    steps: tuple[int, ...]
    max_deliveries: int
    dead_max: int
    floor_every: int
    sweep_limit: int
    inline: bool
    head_left: bool
    bell: bool
    claim_starts: bool


Delivered = tuple[str, bytes, str, int, int]  # id, payload, token, deliveries, attempts
Tokens = Callable[[], str]


class Model:
    """What the contract says the queue's keys hold. Ready levels are kept in claim order
    (index 0 is claimed next), the landing zone in LRANGE order (BLMOVE pushes at the
    left); entries are ids (or BELL) and become payloads in inline mode on the way out."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.now = 0  # ticks
        self.skew = 0  # ms: skew_ms of the call being modelled
        self.known: dict[str, bytes] = {}  # every id ever stored -> payload
        self.reset()

    def reset(self) -> None:
        """An empty queue (no key at all)."""
        cfg = self.cfg
        self.levels: list[list[str]] = [[] for _ in cfg.steps]
        self.processing: list[str] = []
        self.leases: dict[str, Stamp] = {}
        self.delayed: dict[str, Stamp] = {}
        self.dead: dict[str, Stamp] = {}
        self.meta: dict[str, Meta] = {}
        self.payloads: dict[str, bytes] = {}
        self.memo: dict[str, Any] = {}  # 'r:rid' -> reply parts (None: read back); 'd:x' -> id
        self.memo_exp: dict[str, Stamp] = {}
        self.counters: Counter[str] = Counter()
        self.paused = False  # the stats hash's 'paused' field (its time is not modelled)

    # -- small pieces --------------------------------------------------------------------

    def valid_priority(self, p: int) -> bool:
        return 0 <= p <= self.cfg.steps[-1]

    def level_of(self, p: int) -> int:
        return max(1, bisect.bisect_right(self.cfg.steps, p))

    def stamp(self, ticks: int, ms: int) -> Stamp:
        return Stamp(self.skew + ms, self.now + ticks)

    def count(self, name: str, by: int = 1) -> None:
        if by:
            self.counters[name] += by

    def entry_of(self, mid: str) -> bytes:
        if mid == BELL:
            return BELL.encode()
        return self.known[mid] if self.cfg.inline else mid.encode()

    def id_of(self, entry: bytes) -> str:
        if entry == BELL.encode():
            return BELL
        return inline_id(entry) if self.cfg.inline else entry.decode()

    def live(self) -> set[str]:
        ids = {e for lst in self.levels for e in lst} | set(self.processing)
        ids |= set(self.leases) | set(self.delayed) | set(self.dead)
        ids.discard(BELL)
        return ids

    def holds(self, mid: str, token: str) -> Meta | None:
        m = self.meta.get(mid)
        if token in ("", "0") or m is None or m.t != token:
            return None
        return m

    @staticmethod
    def due(entries: dict[str, Stamp], now: int, limit: int) -> list[str]:
        """ZRANGEBYSCORE -inf now LIMIT 0 limit."""
        due = sorted(s.order(k) for k, s in entries.items() if s.due <= now)
        return [k for *_, k in due[:limit]]

    def lrange(self, i: int) -> list[str]:
        lst = self.levels[i]
        return list(lst) if self.cfg.head_left else lst[::-1]

    # -- memo.lua ------------------------------------------------------------------------

    def memo_get(self, name: str) -> Any:
        if name in self.memo and self.memo_exp[name].due > self.now:
            return self.memo[name]
        return None

    def memo_trim(self, limit: int) -> int:
        old = self.due(self.memo_exp, self.now, limit)
        for name in old:
            del self.memo[name], self.memo_exp[name]
        return len(old)

    def memo_put(self, name: str, value: Any, ticks: int) -> None:
        if ord(name[-1]) % 4 == 0:  # one write in four (by the last byte) trims
            self.memo_trim(8)
        self.memo[name] = value
        self.memo_exp[name] = self.stamp(ticks + 1, window_ms(ticks))

    # -- ready.lua -----------------------------------------------------------------------

    def fix_door(self) -> None:
        if not self.cfg.bell or len(self.levels) < 2 or self.levels[0]:
            return
        if any(self.levels[1:]):
            self.levels[0].insert(0, BELL)

    def pick_level(self) -> int | None:
        if len(self.levels) == 1:
            return 0
        top = None
        for i, lst in enumerate(self.levels):
            if i == 0 and lst and lst[0] == BELL:
                lst.pop(0)
            if lst:
                top = i
                break
        if top is None or self.cfg.floor_every <= 0:
            return top
        self.count("floor_seq")
        if self.counters["floor_seq"] % self.cfg.floor_every == 0:
            for i in range(len(self.levels) - 1, top, -1):
                if self.levels[i]:
                    return i
        return top

    # -- settle.lua ----------------------------------------------------------------------

    def to_ready(self, mid: str, m: Meta, front: bool) -> bool:
        if self.cfg.inline:
            if mid not in self.payloads:
                self.meta.pop(mid, None)
                self.count("malformed")
                return False
            del self.payloads[mid]
        lst = self.levels[min(max(m.level, 1), len(self.levels)) - 1]
        if front:
            lst.insert(0, mid)
        else:
            lst.append(mid)
        m.t, m.s = "", False
        if m.blank():
            self.meta.pop(mid, None)
        else:
            self.meta[mid] = m
        return True

    def dead_letter(self, mid: str, m: Meta, reason: str) -> None:
        stamp = Stamp(self.skew)
        m.t, m.s, m.e, m.d = "", False, reason, stamp
        self.meta[mid] = m
        self.dead[mid] = stamp
        self.count("dead_lettered")
        over = len(self.dead) - self.cfg.dead_max
        if over > 0:
            for *_, old in sorted(s.order(k) for k, s in self.dead.items())[:over]:
                del self.dead[old]
                self.meta.pop(old, None)
                self.payloads.pop(old, None)
            self.count("dead_dropped", over)

    def ran_out(self, m: Meta, reason: str) -> str:
        return (
            f"{reason or 'failed'} (ran {m.a} times, delivered {m.n} times, "
            f"max_deliveries={self.cfg.max_deliveries})"
        )

    def send_back(self, mid: str, m: Meta, delay: int, reason: str, front: bool, ran: bool) -> str:
        self.leases.pop(mid, None)
        if ran and not m.s:
            m.a += 1
        started = m.s or ran
        if reason:
            m.e = reason
        if started and m.a >= self.cfg.max_deliveries:
            self.dead_letter(mid, m, self.ran_out(m, reason))
            return "dead"
        if delay > 0:
            m.t, m.s = "", False
            self.meta[mid] = m
            self.delayed[mid] = self.stamp(delay, delay * TICK_MS)
            return "delayed"
        self.to_ready(mid, m, front)
        return "ready"

    # -- take.lua, claiming.lua ----------------------------------------------------------

    def take(self, mid: str, lvl: int, tokens: Tokens) -> Delivered | None:
        m = self.meta.get(mid)
        if m is not None and m.t not in ("", "0"):
            self.count("duplicates_dropped")
            return None
        if m is not None and m.d != 0 and mid in self.dead:
            del self.dead[mid]  # an inline copy pushed again while it is dead: resubmitted
            m = None
            self.count("resubmitted")
        m = m or Meta(lvl)
        m.level = lvl
        payload = self.known[mid] if self.cfg.inline else self.payloads.get(mid)
        if self.cfg.inline:
            self.payloads[mid] = self.known[mid]
        elif payload is None:
            self.leases.pop(mid, None)
            self.dead_letter(mid, m, "payload missing for id")
            self.count("malformed")
            return None
        m.n, m.t, m.s = m.n + 1, tokens(), self.cfg.claim_starts
        if m.s:
            m.a += 1
        self.meta[mid] = m
        self.leases[mid] = self.stamp(LEASE_TICKS, LEASE_TICKS * TICK_MS)
        self.count("claimed")
        return (mid, payload, m.t, m.n, m.a)

    def claim_ready(self, want: int, out: list[Delivered], tokens: Tokens) -> None:
        got = tries = 0
        while got < want and tries < want + 64:
            tries += 1
            lvl = self.pick_level()
            if lvl is None or not self.levels[lvl]:
                break
            entry = self.levels[lvl].pop(0)
            if entry != BELL:
                d = self.take(entry, lvl + 1, tokens)
                if d:
                    out.append(d)
                    got += 1

    def remember_claim(
        self, rid: str, header: list[str | None], out: list[Delivered], nonce: str,
        wrote: bool = False,
    ) -> None:
        """The memo keeps the header, the nonce and the ids: a delivery's token is the
        nonce stamped with the claim's time (``<nonce>@<ms>.``, which the model does not
        predict: it is read off the first token, or read back when nothing was claimed)
        and its position in the reply, its counts are in its record. A call that claimed
        nothing keeps nothing, unless it handled the entry it was given (``wrote``:
        lease.lua)."""
        if out:
            stamped = out[0][2].rstrip("0123456789")
            assert stamped.startswith(nonce + "@"), (nonce, out[0][2])
            self.memo_put("r:" + rid, [*header, stamped] + [d[0] for d in out], 0)
        elif wrote:
            self.memo_put("r:" + rid, [*header, None], 0)

    def replay_claim(
        self, kept: list[str], header: int, starts: bool
    ) -> tuple[list[int], list[Delivered]]:
        out = []
        nonce = kept[header]
        for j, mid in enumerate(kept[header + 1 :]):
            token = f"{nonce}{header + 5 * j}"
            m = self.meta.get(mid)
            if m is not None and m.t == token and mid in self.payloads:
                a = m.a if starts or not m.s else m.a - 1
                out.append((mid, self.payloads[mid], token, m.n, a))
        return [int(h) for h in kept[:header]], out

    # -- recover.lua ---------------------------------------------------------------------

    def sweep_expired(self, limit: int) -> tuple[int, int, int]:
        reclaimed = died = adopted = 0
        md = self.cfg.max_deliveries
        for mid in self.due(self.leases, self.now, limit):
            m = self.meta.get(mid)
            if m is None:
                del self.leases[mid]
                self.dead_letter(mid, Meta(1), "message state missing for a leased id")
                died += 1
            elif m.t == "0":
                del self.leases[mid]
                if not self.cfg.inline or mid in self.payloads:
                    lrem(self.processing, -1, mid)
                m.x += 1
                if m.x >= md:
                    reason = (
                        "its consumers vanished between receiving it and leasing it "
                        f"{m.x} times (max_deliveries={md})"
                    )
                    self.dead_letter(mid, m, reason)
                    died += 1
                elif self.to_ready(mid, m, True):
                    adopted += 1
            elif self.send_back(mid, m, 0, "lease expired", True, False) == "dead":
                died += 1
            else:
                reclaimed += 1
        self.count("reclaimed", reclaimed)
        self.count("adopted", adopted)
        return reclaimed, died, adopted

    def adopt_landing(self, limit: int) -> int:
        if not self.processing:
            return 0
        found = 0
        for entry in self.processing[-limit:]:
            if entry == BELL:
                self.processing = [e for e in self.processing if e != BELL]
            elif entry not in self.leases:
                m = self.meta.get(entry) or Meta(1)
                m.t, m.s = "0", False
                self.meta[entry] = m
                if self.cfg.inline:
                    self.payloads[entry] = self.known[entry]
                self.leases[entry] = self.stamp(LEASE_TICKS, LEASE_TICKS * TICK_MS)
                found += 1
        self.count("orphans_found", found)
        return found

    def promote_due(self, limit: int) -> int:
        promoted = 0
        for mid in self.due(self.delayed, self.now, limit):
            del self.delayed[mid]
            if self.to_ready(mid, self.meta.get(mid) or Meta(1), False):
                promoted += 1
        self.count("promoted", promoted)
        return promoted

    # -- one method per script -----------------------------------------------------------

    def publish(
        self, groups: list[tuple[str, bytes, int, int, str | None]], rid: str
    ) -> list[tuple[str, bool, str]]:
        """groups: (client id, payload, level, delay ticks, dedup id)."""
        kept = self.memo_get("r:" + rid)
        if kept is not None:
            return [(kept[i], kept[i + 1] == "1", kept[i + 2]) for i in range(0, len(kept), 3)]
        out: list[tuple[str, bool, str]] = []
        for cid, payload, level, delay, dedup in groups:
            mid = inline_id(payload) if self.cfg.inline else cid
            first = self.memo_get("d:" + dedup) if dedup else None
            if first is not None:
                out.append((first, False, self.state_of(first)))
                self.count("deduplicated")
                continue
            if dedup:
                self.memo_put("d:" + dedup, mid, DEDUP_TICKS)
            self.known[mid] = payload
            if not self.cfg.inline or delay > 0:
                self.payloads[mid] = payload
            if delay > 0:
                self.meta[mid] = Meta(level, u=Stamp(self.skew))
                self.delayed[mid] = self.stamp(delay, delay * TICK_MS)
            else:
                self.levels[level - 1].append(mid)
            self.count("published")
            out.append((mid, True, ""))
        self.fix_door()
        parts = [p for mid, stored, state in out for p in (mid, "1" if stored else "0", state)]
        self.memo_put("r:" + rid, parts, 0)
        return out

    def state_of(self, mid: str) -> str:
        for name, where in (("in_flight", self.leases), ("delayed", self.delayed)):
            if mid in where:
                return name
        if mid in self.dead:
            return "dead"
        if self.cfg.inline:
            return "unknown"
        return "ready" if mid in self.payloads else "gone"

    def claim(self, want: int, rid: str, tokens: Tokens, due_ms: int | None) -> list[Delivered]:
        limit = self.cfg.sweep_limit
        self.sweep_expired(limit)
        self.adopt_landing(limit)
        self.promote_due(limit)
        out: list[Delivered] = []
        if not self.paused:
            self.claim_ready(want, out, tokens)
        self.fix_door()
        self.remember_claim(rid, [None if due_ms is None else str(due_ms)], out, rid)
        return out

    def hand_back(self, mid: str) -> None:
        """lease.lua on a paused queue: the landed entry goes back to the head of the first
        level as if never claimed (a provisional lease it had is taken over and dropped)."""
        m = self.meta.get(mid)
        if m is not None and m.t not in ("", "0"):
            self.count("duplicates_dropped")
            return
        if m is not None and m.d != 0 and mid in self.dead:
            del self.dead[mid]
            m = None
            self.count("resubmitted")
        m = m or Meta(1)
        m.level = 1
        if self.cfg.inline:
            self.payloads[mid] = self.known[mid]
        elif mid not in self.payloads:
            self.leases.pop(mid, None)
            self.dead_letter(mid, m, "payload missing for id")
            self.count("malformed")
            return
        self.leases.pop(mid, None)
        self.to_ready(mid, m, True)

    def blmove(self) -> str | None:
        if not self.levels[0]:
            return None
        entry = self.levels[0].pop(0)
        self.processing.insert(0, entry)
        return entry

    def lease(
        self, entry: str, want: int, rid: str, tokens: Tokens, due_ms: int
    ) -> tuple[bool, list[Delivered]]:
        out: list[Delivered] = []
        lost = False
        if entry == BELL:
            lrem(self.processing, 1, BELL)
        elif lrem(self.processing, 1, entry) == 0:
            self.count("lost_claims")
            lost = True
        elif self.paused:
            self.hand_back(entry)
        else:
            d = self.take(entry, 1, tokens)
            if d:
                out.append(d)
                want -= 1
            else:
                lost = True
        limit = self.cfg.sweep_limit  # the bounded recovery, after the landing's own entry
        self.sweep_expired(limit)
        self.adopt_landing(limit)
        self.promote_due(limit)
        if want > 0 and not self.paused:
            self.claim_ready(want, out, tokens)
        self.fix_door()
        self.remember_claim(rid, [str(due_ms), "1" if lost else "0"], out, rid,
                            wrote=entry != BELL)
        return lost, out

    def earlier(self, rid: str) -> list[str] | None:
        """The reply an earlier run of request ``rid`` kept (memo.lua's earlier_reply)."""
        kept: list[str] | None = self.memo_get("r:" + rid) if rid else None
        return kept

    def ack(self, pairs: list[tuple[str, str]], rid: str = "") -> list[bool]:
        kinds, settling = [], set()
        for mid, token in pairs:  # every claim's state read before anything is written
            if mid in settling:
                kinds.append("again")
            elif self.holds(mid, token):
                settling.add(mid)
                kinds.append("held")
            elif mid in self.meta or mid in self.payloads:
                kinds.append("stale")
            else:
                kinds.append("gone")  # gone (a re-sent ack), or inline and waiting blank
        if "stale" in kinds or "gone" in kinds:
            kept = self.earlier(rid)
            if kept is not None:
                return [x == "1" for x in kept]
        out = []
        for (mid, _), kind in zip(pairs, kinds, strict=True):
            if kind == "held":
                self.leases.pop(mid, None)
                del self.meta[mid]
                self.payloads.pop(mid, None)
                self.count("acked")
            elif kind == "stale":
                self.count("stale_acks")
            out.append(kind != "stale")
        if "stale" in kinds:
            self.remember(rid, ["1" if ok else "0" for ok in out])
        return out

    def nack(
        self, mid: str, token: str, delay: int, reason: str, bury: bool, rid: str = ""
    ) -> str:
        kept = self.earlier(rid)
        if kept is not None:
            return kept[0]
        m = self.holds(mid, token)
        if m is None:
            if mid in self.meta:
                self.count("stale_acks")
                self.remember(rid, ["stale"])
            return "stale"
        self.count("nacked")
        if bury:
            self.leases.pop(mid, None)
            if not m.s:
                m.a += 1
            self.dead_letter(mid, m, reason)
            outcome = "dead"
        else:
            outcome = self.send_back(mid, m, delay, reason, True, True)
            self.fix_door()
        self.remember(rid, [outcome])
        return outcome

    def remember(self, rid: str, reply: list[str]) -> None:
        """A settle's reply kept for a re-send under its request id."""
        if rid:
            self.memo_put("r:" + rid, reply, 0)

    def extend(
        self, triples: list[tuple[str, str, bool]], count_stale: bool, rid: str = ""
    ) -> list[bool]:
        kept = self.earlier(rid)
        if kept is not None:
            return [x == "1" for x in kept]
        out, stale = [], 0
        for mid, token, start in triples:
            m = self.holds(mid, token)
            if m is not None:
                assert mid in self.leases, f"{mid} is held but has no lease"
                self.leases[mid] = self.stamp(LEASE_TICKS, LEASE_TICKS * TICK_MS)
                if start and not m.s:
                    m.a, m.s = m.a + 1, True
                out.append(True)
            else:
                stale += 1
                out.append(False)
        if count_stale:
            self.count("stale_acks", stale)
        if stale < len(out) or (count_stale and stale):
            self.remember(rid, ["1" if ok else "0" for ok in out])
        return out

    def release(self, pairs: list[tuple[str, str]], rid: str = "") -> int:
        released = stale = 0
        for mid, token in reversed(pairs):
            m = self.holds(mid, token)
            if m is not None:
                self.leases.pop(mid, None)
                m.n = max(0, m.n - 1)
                if m.s:
                    m.a = max(0, m.a - 1)
                self.to_ready(mid, m, True)
                released += 1
            elif mid in self.meta:
                stale += 1
        self.fix_door()
        self.count("released", released)
        self.count("stale_acks", stale)
        if released or stale:
            self.remember(rid, [str(released)])
        return released

    def defer(self, triples: list[tuple[str, str, int]], rid: str = "") -> int:
        deferred = stale = 0
        for mid, token, delay in triples:
            m = self.holds(mid, token)
            if m is not None:
                self.leases.pop(mid, None)
                m.n = max(0, m.n - 1)
                if m.s:
                    m.a = max(0, m.a - 1)
                m.t, m.s = "", False
                self.meta[mid] = m
                self.delayed[mid] = self.stamp(delay, delay * TICK_MS)
                deferred += 1
            elif mid in self.meta:
                stale += 1
        self.count("deferred", deferred)
        self.count("stale_acks", stale)
        if deferred or stale:
            self.remember(rid, [str(deferred)])
        return deferred

    def sweep(self, rid: str = "") -> tuple[bool, int, int, int, int, int]:
        kept = self.earlier(rid)
        if kept is not None:
            ran, *counts = (int(x) for x in kept)
            return (bool(ran), *counts)  # type: ignore[return-value]
        reclaimed, died, adopted = self.sweep_expired(SWEEP_LIMIT)
        orphans = self.adopt_landing(SWEEP_LIMIT)
        promoted = self.promote_due(SWEEP_LIMIT)
        self.memo_trim(SWEEP_LIMIT)
        self.fix_door()
        out = (True, reclaimed, died, adopted, promoted, orphans)
        if reclaimed + died + adopted + promoted + orphans:
            self.remember(rid, [str(int(x)) for x in out])
        return out

    def pause(self, rid: str = "") -> bool:
        kept = self.earlier(rid)
        if kept is not None:
            return kept[0] == "1"
        if self.paused:
            return False
        self.paused = True
        self.remember(rid, ["1"])
        return True

    def resume(self, rid: str = "") -> bool:
        kept = self.earlier(rid)
        if kept is not None:
            return kept[0] == "1"
        if not self.paused:
            return False
        self.paused = False
        self.remember(rid, ["1"])
        return True

    def delete_dead(self, ids: list[str] | None, limit: int, rid: str = "") -> int:
        """QueueAdmin.delete_dead: discard.lua."""
        kept = self.earlier(rid)
        if kept is not None:
            return int(kept[0])
        if ids:
            chosen = list(dict.fromkeys(mid for mid in ids if mid in self.dead))
        else:
            chosen = [k for *_, k in sorted(s.order(k) for k, s in self.dead.items())[:limit]]
        for mid in chosen:
            del self.dead[mid]
            self.meta.pop(mid, None)
            self.payloads.pop(mid, None)
        self.count("discarded", len(chosen))
        self.remember(rid, [str(len(chosen))])  # kept even when nothing was deleted
        return len(chosen)

    def replay(self, ids: list[str] | None, limit: int, rid: str = "") -> int:
        kept = self.earlier(rid)
        if kept is not None:
            return int(kept[0])
        if ids:
            chosen = [mid for mid in ids if self.dead.pop(mid, None) is not None]
        else:
            chosen = [k for *_, k in sorted(s.order(k) for k, s in self.dead.items())[:limit]]
            for mid in chosen:
                del self.dead[mid]
        replayed = 0
        for mid in chosen:
            m = self.meta.get(mid) or Meta(1)
            m.n = m.a = m.x = 0
            m.d, m.e = 0, ""
            if (self.cfg.inline or mid in self.payloads) and self.to_ready(mid, m, False):
                replayed += 1
            else:
                self.meta.pop(mid, None)
        self.fix_door()
        self.count("replayed", replayed)
        self.remember(rid, [str(replayed)])  # kept even when nothing was replayed
        return replayed

    def purge(self, rids: Callable[[], str] = str) -> int:
        """QueueAdmin.purge: purge.lua until nothing waits (or a call purged nothing); each
        call's request id from ``rids``."""
        total = 0
        while True:
            purged, more = self._purge_once(PURGE_LIMIT, rids())
            total += purged
            if not more or not purged:
                return total

    def _purge_once(self, limit: int, rid: str = "") -> tuple[int, bool]:
        kept = self.earlier(rid)
        if kept is not None:
            return int(kept[0]) + int(kept[1]), kept[2] == "1"
        purged = 0

        def forget(mid: str) -> None:
            if mid not in self.leases and mid not in self.dead:
                self.meta.pop(mid, None)
                self.payloads.pop(mid, None)

        for i in range(len(self.levels)):
            rest = self.lrange(i)
            while purged < limit:
                batch, rest = rest[: limit - purged], rest[limit - purged :]
                if not batch:
                    break
                for entry in batch:
                    if entry != BELL:
                        purged += 1
                        forget(entry)
            self.levels[i] = rest if self.cfg.head_left else rest[::-1]
        ready = purged
        if purged < limit:
            for *_, mid in sorted(s.order(k) for k, s in self.delayed.items())[: limit - purged]:
                del self.delayed[mid]
                forget(mid)
                purged += 1
        self.count("purged", purged)
        more = bool(self.delayed) or any(self.levels)
        self.remember(rid, [str(ready), str(purged - ready), "1" if more else "0"])
        return purged, more

    def drop(self) -> bool:
        if self.processing or self.leases:
            return False
        self.reset()
        return True

    # -- what Redis must hold ------------------------------------------------------------

    def stamps(self) -> list[tuple[str, str, Stamp]]:
        """Every (structure, member, stamp) the model holds; meta's 'u' as ('u', id)."""
        out = [
            (name, k, s)
            for name in ("leases", "delayed", "dead", "memo_exp")
            for k, s in getattr(self, name).items()
        ]
        out += [("u", k, m.u) for k, m in self.meta.items() if isinstance(m.u, Stamp)]
        return out

    def unread(self) -> bool:
        """Whether a time or a memo header the last call wrote is still to be read back."""
        return any(s.value is None for *_, s in self.stamps()) or any(
            isinstance(v, list) and None in v for v in self.memo.values()
        )

    def expected(self) -> dict[str, Any]:
        """What ``observe`` must return (every stamp read back)."""
        zs = {
            name: {k: s.value for k, s in getattr(self, name).items()}
            for name in ("leases", "delayed", "dead", "memo_exp")
        }
        stats = dict(+self.counters)
        if stats or self.paused:
            stats["schema"] = 2
        return {
            "levels": [[self.entry_of(e) for e in self.lrange(i)] for i in range(len(self.levels))],
            "processing": [self.entry_of(e) for e in self.processing],
            **zs,
            "meta": {k: m.parsed() for k, m in self.meta.items()},
            "payloads": dict(self.payloads),
            "memo": dict(self.memo),
            "stats": stats,
            "paused": self.paused,
        }


def lrem(lst: list[str], count: int, value: str) -> int:
    """Redis LREM on a Python list kept in LRANGE order."""
    found = [i for i, v in enumerate(lst) if v == value]
    found = found[:count] if count > 0 else found[count:] if count < 0 else found
    for i in reversed(found):
        del lst[i]
    return len(found)


def observe(client: Any, keys: Any, model: Model) -> dict[str, Any]:
    """Every key of the queue, in the shapes of ``Model.expected`` (memo replies unpacked)."""
    pipe = client.pipeline(transaction=False)
    for lvl in keys.levels:
        pipe.lrange(lvl, 0, -1)
    pipe.lrange(keys.processing, 0, -1)
    for z in (keys.leases, keys.delayed, keys.dead, keys.memo_exp):
        pipe.zrange(z, 0, -1, withscores=True)
    for h in (keys.meta, keys.payloads, keys.memo, keys.stats):
        pipe.hgetall(h)
    reply = pipe.execute()
    nl = len(keys.levels)
    zs = [{k.decode(): int(v) for k, v in z} for z in reply[nl + 1 : nl + 5]]
    meta, payloads, memo, stats = reply[nl + 5 :]
    return {
        "levels": [list(lst) for lst in reply[:nl]],
        "processing": list(reply[nl]),
        **dict(zip(("leases", "delayed", "dead", "memo_exp"), zs, strict=True)),
        "meta": {k.decode(): parse_meta(v) for k, v in meta.items()},
        "payloads": {k.decode(): v for k, v in payloads.items()},
        "memo": {
            k.decode(): v.decode() if k.startswith(b"d:") else unpack(v) for k, v in memo.items()
        },
        "stats": {k.decode(): int(v) for k, v in stats.items() if k != b"paused"},
        "paused": b"paused" in stats,
    }


def fill_stamps(model: Model, seen: dict[str, Any], t0: int, t1: int) -> None:
    """Take the times the last call wrote from Redis, checking each against its window
    [t0, t1] of server time; and the claim-memo headers the model could not know."""
    for name, member, stamp in model.stamps():
        if stamp.value is not None:
            continue
        if name == "u":
            got = (seen["meta"].get(member) or {}).get("published_ms")
        else:
            got = seen[name].get(member)
        assert got is not None, f"{name}: {member} is missing"
        assert t0 <= got - stamp.offset <= t1, (name, member, got - stamp.offset, t0, t1)
        stamp.value = got
    for name, parts in model.memo.items():
        if isinstance(parts, list) and None in parts:
            got = seen["memo"].get(name)
            assert got is not None and len(got) == len(parts), (name, got, parts)
            assert all(p is None or p == g for p, g in zip(parts, got, strict=True)), (got, parts)
            model.memo[name] = got


def contract_problems(seen: dict[str, Any], model: Model) -> list[str]:
    """What must hold on Redis whatever the model's bookkeeping says."""
    cfg, bell = model.cfg, BELL.encode()
    bad: list[str] = []
    levels, processing = seen["levels"], seen["processing"]
    leases, meta, payloads = seen["leases"], seen["meta"], seen["payloads"]
    places: Counter[str] = Counter()
    for i, lst in enumerate(levels):
        for e in lst:
            if e == bell:
                continue
            mid = model.id_of(e)
            places[mid] += 1
            m = meta.get(mid)
            if m is not None and (m["level"] != i + 1 or m["token"] != ""):
                bad.append(f"ready {mid} in level {i + 1} has meta {m}")
    landing = {model.id_of(e) for e in processing if e != bell}
    places.update(landing | set(leases))
    places.update(list(seen["delayed"]) + list(seen["dead"]))
    live = model.live()
    if set(places) - set(model.known):
        bad.append(f"unknown entries {set(places) - set(model.known)}")
    for mid in set(model.known) | set(places):
        want = 1 if mid in live else 0
        if places[mid] != want:
            bad.append(f"{mid} is in {places[mid]} places, expected {want}")
    for mid in leases:
        m = meta.get(mid)
        if m is None or m["token"] == "":
            bad.append(f"lease of {mid} without a held meta: {m}")
        elif (m["token"] == "0") != (mid in landing):
            bad.append(f"{mid}: token {m['token']!r}, in the landing zone: {mid in landing}")
    for mid, m in meta.items():
        if m is None:
            bad.append(f"unreadable meta of {mid}")
            continue
        if (m["token"] != "") != (mid in leases):
            bad.append(f"{mid}: token {m['token']!r} but leased={mid in leases}")
        if m["attempts"] > cfg.max_deliveries or (m["started"] and m["token"] in ("", "0")):
            bad.append(f"{mid}: meta {m}")
        if cfg.claim_starts and m["attempts"] != m["deliveries"]:
            bad.append(f"{mid}: claims start, yet attempts != deliveries: {m}")
        if (mid in seen["dead"]) != (m["dead_ms"] != 0) or (
            mid in seen["dead"] and (m["error"] == "" or m["dead_ms"] != seen["dead"][mid])
        ):
            bad.append(f"dead letter {mid}: meta {m}")
    for mid in [*leases, *seen["delayed"], *seen["dead"]]:
        if mid not in meta:
            bad.append(f"{mid} is leased, delayed or dead without meta")
    for mid in live:
        kept = mid in leases or mid in seen["delayed"] or mid in seen["dead"]
        if (mid in payloads) != (kept or not cfg.inline):
            bad.append(f"{mid}: payload stored={mid in payloads}")
    if any(bell in lst for lst in levels[1:]) or levels[0].count(bell) > 1:
        bad.append(f"bells misplaced: {levels}")
    if not cfg.bell and (bell in levels[0] or bell in processing):
        bad.append("a bell with the bell off")
    if seen["stats"] and seen["stats"].get("schema") != 2:
        bad.append(f"stats without schema 2: {seen['stats']}")
    return bad


@dataclass
class ClientModel:
    """A queue object's own bookkeeping (HeldClaims): held id -> token, pending starts."""

    held: dict[str, str] = field(default_factory=dict)
    starting: set[str] = field(default_factory=set)
    #: The start reports sent without waiting, whose replies the object reads later (at its
    #: next report or beat): (id, token, held) per claim reported.
    reports: list[list[tuple[str, str, bool]]] = field(default_factory=list)

    def collect(self) -> None:
        """The object reads its start reports' replies: it forgets the claims they found
        no longer held (collect_starts)."""
        reports, self.reports = self.reports, []
        for report in reports:
            for mid, token, ok in report:
                if not ok and self.held.get(mid) == token:
                    del self.held[mid]
                    self.starting.discard(mid)

    def take(self, ds: Iterable[Any]) -> None:
        for d in ds:
            self.held[d.id] = d.token

    def forget(self, ds: Iterable[Any]) -> None:
        for d in ds:
            if self.held.get(d.id) == d.token:
                del self.held[d.id]
                self.starting.discard(d.id)

    def restore(self, ds: Iterable[Any]) -> None:  # a settle that raised
        for d in ds:
            self.held.setdefault(d.id, d.token)

    def check(self, q: Any) -> None:
        assert {k: d.token for k, d in q._held.items()} == self.held
        assert q._starting == self.starting
