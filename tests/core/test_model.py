"""Model-based (hypothesis stateful) test of the queue contract, DESIGN.md section 2.

Random sequences of publish (priority, delay, dedup id; one by one and publish_many),
claim (try_claim and claim(timeout=0), count 1..5), the blocking claim's two halves
(BLMOVE, then lease_claimed, possibly after the sweep took the entry back), ack /
ack_many, nack (now or delayed, with a reason), dead_letter, extend, release, settles
with stale or forged tokens, exact re-sends of earlier settles (request ids), consumer
crashes (a consumer forgets what it holds and any entry it BLMOVE-d but never leased),
sweep, time travel, replay_dead and purge run against one real Redis queue and, step by
step, against ``Model``: a pure-Python model of what the contract promises.

After every step the model and the queue must agree on

* every Redis structure (each ready level in order, processing, leases, delayed, dead) and
  every message hash (payload, level, deliveries, token, last error, dead-at);
* ``stats()`` (the five sizes and every counter, ``stale_acks`` included) and
  ``dead_letters()``;

and, independently of the model's bookkeeping, the contract must hold on Redis itself:
each published, unacked message is in exactly one of ready / delayed / in flight / dead
(no loss, no copy), every leased id is in processing, no message was delivered more than
``max_deliveries`` times, and a dead letter carries its reason.

Every claim must return exactly the deliveries the model predicts (id, payload, a fresh
token, deliveries = previous + 1) in the order the contract promises: highest-priority
level first, FIFO within a level, except that a message requeued by nack, sweep or release
goes to the front of its level (and, with ``starvation_floor``, every k-th pick that finds
work serves the lowest non-empty level below the top one). A settle with a stale token is
refused, counted in ``stale_acks`` and changes nothing; an exact re-send of an earlier
settle call answers as the first did and changes nothing.

Time: the scripts read the server clock plus ``_scripts.skew_ms``. The model counts in
ticks of ``TICK_MS`` (far longer than any example runs), leases and delays are whole ticks
and time only moves by whole ticks (on every queue object), so whether a lease expired or
a delay is due never depends on how fast this machine is. Each step also adds 1 ms of
skew and message ids count up, so ties inside one tick (which of two leases expired first)
fall the same way on every run; the model takes them from the scores the scripts wrote,
read back after each operation and checked to lie inside its server-time window.
"""

from __future__ import annotations

import bisect
import re
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from belayq import ReliableQueue
from belayq.models import Delivery
from belayq.scripts import source

TICK_MS = 1_000_000  # one model tick; an example runs for far less real time than this
LEASE_TICKS = 2
LEVELS = [(0,), (0, 5, 9), (0, 5, 9)]  # priority_steps: one ready list, or three levels
BELL = "\0belayq:bell"  # common.lua's wake-up marker (lives in level 1 and processing only)
LIVE = ("ready", "delayed", "flight", "dead")
SWEEP_LIMIT = 1000  # ReliableQueue.sweep() passes this bound

# The core keeps the reply of each ack/nack/dead_letter/release call this long (ms, real
# server time) so that a re-sent call answers as the first did; 0 when it keeps none.
_TTL = re.search(r"REPLY_TTL_MS = (\d+)", source("ack"))
REPLY_TTL_MS = int(_TTL.group(1)) if _TTL else 0

SETTINGS = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def lrem(lst: list[str], count: int, value: str) -> int:
    """Redis LREM on a Python list kept in LRANGE order."""
    found = [i for i, v in enumerate(lst) if v == value]
    if count > 0:
        found = found[:count]
    elif count < 0:
        found = found[count:]
    for i in reversed(found):
        del lst[i]
    return len(found)


@dataclass
class Msg:
    id: str
    payload: bytes
    level: int  # 1-based
    state: str = "ready"  # ready | delayed | flight | dead, or acked | purged | dropped
    n: int = 0  # deliveries
    token: str | None = None  # current claim's token; '0' = provisional (sweep)
    err: str | None = None  # last error ('e')


class Model:
    """What the contract says the queue holds, kept in the same shapes as the Redis keys.

    Lists are in LRANGE order: a ready level's *front* (the next claim) is its right end,
    publish and promotion add at the left (back), nack/sweep/release add at the right.
    Level 1 may hold a bell (common.lua's wake-up marker for blocked claimers); where the
    scripts ring it is theirs to choose, so the machine copies its place from Redis after
    each step and checks only what it is for (see ``agrees_with_model``).
    """

    def __init__(
        self,
        *,
        steps: tuple[int, ...],
        max_deliveries: int,
        floor_every: int,
        sweep_limit: int,
        dead_max: int,
    ) -> None:
        self.max_deliveries = max_deliveries
        self.floor_every = floor_every
        self.sweep_limit = sweep_limit
        self.dead_max = dead_max
        self.now = 0  # ticks
        self.steps = steps
        self.levels: list[list[str]] = [[] for _ in steps]
        self.processing: list[str] = []
        self.leases: dict[str, list[Any]] = {}  # id -> [deadline tick, score read back]
        self.delayed: dict[str, list[Any]] = {}  # id -> [due tick, score read back]
        self.dead: list[str] = []  # newest first
        self.msgs: dict[str, Msg] = {}
        self.counters: Counter[str] = Counter()
        self.dedup: dict[str, str] = {}

    # -- helpers -------------------------------------------------------------------------

    def level_of(self, priority: int) -> int:
        return max(1, bisect.bisect_right(self.steps, priority))

    def live(self) -> list[Msg]:
        return [m for m in self.msgs.values() if m.state in LIVE]

    def valid(self, mid: str, token: str) -> bool:
        m = self.msgs.get(mid)
        return token != "0" and m is not None and m.token == token

    def push_ready(self, mid: str, front: bool) -> None:
        m = self.msgs[mid]
        lst = self.levels[m.level - 1]
        if front:
            lst.append(mid)
        else:
            lst.insert(0, mid)
        m.state = "ready"

    def dead_letter(self, mid: str, reason: str) -> None:
        m = self.msgs[mid]
        m.err, m.token, m.state = reason, None, "dead"
        self.dead.insert(0, mid)
        self.counters["dead_lettered"] += 1
        while len(self.dead) > self.dead_max:
            old = self.msgs[self.dead.pop()]
            old.state, old.token = "dropped", None
            self.counters["dead_dropped"] += 1

    def send_back(
        self, mid: str, delay: int, reason: str | None, front: bool, may_die: bool
    ) -> str:
        """A message leaves processing unacked: dead after max_deliveries, else delayed or
        back on its level."""
        m = self.msgs[mid]
        self.leases.pop(mid, None)
        m.token = None
        if reason:
            m.err = reason
        if may_die and m.n >= self.max_deliveries:
            self.dead_letter(
                mid,
                f"{reason or 'failed'} (delivered {m.n} times, "
                f"max_deliveries={self.max_deliveries})",
            )
            return "dead"
        if delay > 0:
            self.delayed[mid] = [self.now + delay, None]
            m.state = "delayed"
            return "delayed"
        self.push_ready(mid, front)
        return "ready"

    @staticmethod
    def _due(entries: dict[str, list[Any]], now: int, limit: int) -> list[str]:
        """ZRANGEBYSCORE -inf now LIMIT 0 limit: by score, ties by member."""
        due = [(e[1], mid) for mid, e in entries.items() if e[0] <= now]
        assert all(score is not None for score, _ in due)
        return [mid for _, mid in sorted(due)[:limit]]

    def sweep_expired(self, limit: int) -> tuple[int, int, int]:
        reclaimed = died = adopted = 0
        for mid in self._due(self.leases, self.now, limit):
            token = self.msgs[mid].token
            lrem(self.processing, -1, mid)
            if token == "0":
                self.send_back(mid, 0, None, True, False)
                adopted += 1
            elif self.send_back(mid, 0, "lease expired", True, True) == "dead":
                died += 1
            else:
                reclaimed += 1
        self.counters["reclaimed"] += reclaimed
        self.counters["adopted"] += adopted
        return reclaimed, died, adopted

    def promote_due(self, limit: int) -> int:
        ids = self._due(self.delayed, self.now, limit)
        for mid in ids:
            del self.delayed[mid]
            self.push_ready(mid, False)
        self.counters["promoted"] += len(ids)
        return len(ids)

    def pick_level(self) -> int | None:
        """The highest-priority non-empty level (bells at a head are dropped on the way);
        with the floor on, every floor_every-th pick that finds work takes the lowest
        non-empty level below that one instead."""
        if len(self.levels) == 1:
            return 0 if self.levels[0] else None  # no bells, no floor
        top = None
        for i, lst in enumerate(self.levels):
            while lst and lst[-1] == BELL:
                lst.pop()
            if lst:
                top = i
                break
        if top is None or self.floor_every <= 0:
            return top
        self.counters["floor_seq"] += 1
        if self.counters["floor_seq"] % self.floor_every == 0:
            for i in range(len(self.levels) - 1, top, -1):
                if self.levels[i]:
                    return i
        return top

    def lease_entry(self, entry: str) -> tuple[str, bytes, str, int] | None:
        m = self.msgs[entry]  # a listed id always has its hash (nothing here deletes one)
        if m.token not in (None, "0"):
            # Already leased. Only a second copy in processing is a duplicate to drop; the
            # single copy there is the current holder's, and this claimer lost its entry.
            if self.processing.count(entry) > 1:
                lrem(self.processing, 1, entry)
                self.counters["duplicates_dropped"] += 1
            else:
                self.counters["lost_claims"] += 1
            return None
        m.n += 1
        self.counters["seq"] += 1
        m.token = str(self.counters["seq"])
        m.state = "flight"
        self.leases[entry] = [self.now + LEASE_TICKS, None]
        self.counters["claimed"] += 1
        return (m.id, m.payload, m.token, m.n)

    def claim_ready(self, want: int, out: list[tuple[str, bytes, str, int]]) -> None:
        got = attempts = 0
        while got < want and attempts < want + 64:
            attempts += 1
            lvl = self.pick_level()
            if lvl is None:
                break
            entry = self.levels[lvl].pop()
            self.processing.insert(0, entry)
            if entry == BELL:
                lrem(self.processing, 1, BELL)
                continue
            d = self.lease_entry(entry)
            if d:
                out.append(d)
                got += 1

    # -- transitions (one per script) ----------------------------------------------------

    def publish(
        self, mid: str, payload: bytes, level: int, delay: int, dedup: str | None
    ) -> str | None:
        """Returns the id the publish must answer with, or None for a new message."""
        if dedup is not None and dedup in self.dedup:
            self.counters["deduplicated"] += 1
            return self.dedup[dedup]
        assert mid not in self.msgs
        if dedup is not None:
            self.dedup[dedup] = mid
        self.msgs[mid] = m = Msg(mid, payload, level)
        if delay > 0:
            self.delayed[mid] = [self.now + delay, None]
            m.state = "delayed"
        else:
            self.levels[level - 1].insert(0, mid)
        self.counters["published"] += 1
        return None

    def claim(self, want: int) -> list[tuple[str, bytes, str, int]]:
        self.sweep_expired(self.sweep_limit)
        self.promote_due(self.sweep_limit)
        out: list[tuple[str, bytes, str, int]] = []
        self.claim_ready(want, out)
        return out

    def blmove(self) -> str | None:
        """BLMOVE level 1 -> processing (a blocking claimer's first half)."""
        if not self.levels[0]:
            return None
        entry = self.levels[0].pop()
        self.processing.insert(0, entry)
        if entry != BELL:
            self.msgs[entry].state = "flight"  # in processing, no lease yet
        return entry

    def lease(self, entry: str, want: int) -> list[tuple[str, bytes, str, int]]:
        """lease.lua: the second half; lost when the sweep took the entry back first."""
        out: list[tuple[str, bytes, str, int]] = []
        if entry == BELL:
            lrem(self.processing, 1, BELL)
        elif entry not in self.processing:
            self.counters["lost_claims"] += 1
        else:
            d = self.lease_entry(entry)
            if d:
                out.append(d)
                want -= 1
        if want > 0:
            self.claim_ready(want, out)
        return out

    def ack(self, pairs: list[tuple[str, str]]) -> list[bool]:
        out = []
        for mid, token in pairs:
            if self.valid(mid, token):
                m = self.msgs[mid]
                lrem(self.processing, -1, mid)
                self.leases.pop(mid, None)
                m.state, m.token = "acked", None
                self.counters["acked"] += 1
                out.append(True)
            else:
                self.counters["stale_acks"] += 1
                out.append(False)
        return out

    def nack(self, mid: str, token: str, delay: int, reason: str, bury: bool) -> str:
        if not self.valid(mid, token):
            self.counters["stale_acks"] += 1
            return "stale"
        lrem(self.processing, -1, mid)
        self.counters["nacked"] += 1
        if bury:
            self.leases.pop(mid, None)
            self.dead_letter(mid, reason)
            return "dead"
        outcome = self.send_back(mid, delay, reason, True, True)
        return outcome

    def extend(self, pairs: list[tuple[str, str]]) -> list[bool]:
        out = []
        for mid, token in pairs:
            ok = self.valid(mid, token)
            if ok:
                self.leases[mid] = [self.now + LEASE_TICKS, None]
            else:
                self.counters["stale_acks"] += 1
            out.append(ok)
        return out

    def release(self, pairs: list[tuple[str, str]]) -> int:
        released = 0
        for mid, token in reversed(pairs):
            if self.valid(mid, token):
                lrem(self.processing, -1, mid)
                self.msgs[mid].n -= 1
                self.send_back(mid, 0, None, True, False)
                released += 1
            else:
                self.counters["stale_acks"] += 1
        self.counters["released"] += released
        return released

    def sweep(self) -> tuple[bool, int, int, int, int, int]:
        reclaimed, died, adopted = self.sweep_expired(SWEEP_LIMIT)
        orphans = 0
        for entry in list(self.processing):
            if entry == BELL:
                lrem(self.processing, 0, BELL)
            elif entry not in self.leases:
                # A claimer died between BLMOVE and lease.lua: a provisional lease.
                self.msgs[entry].token = "0"
                self.leases[entry] = [self.now + LEASE_TICKS, None]
                orphans += 1
        self.counters["orphans_found"] += orphans
        promoted = self.promote_due(SWEEP_LIMIT)
        self.counters["sweeps"] += 1
        return (True, reclaimed, died, adopted, promoted, orphans)

    def replay(self, ids: list[str], limit: int) -> int:
        if ids:
            chosen = [mid for mid in ids if lrem(self.dead, 1, mid) > 0]
        else:
            chosen = []
            while len(chosen) < limit and self.dead:
                chosen.append(self.dead.pop())
        for mid in chosen:
            m = self.msgs[mid]
            m.n, m.err, m.token = 0, None, None
            self.push_ready(mid, False)
        self.counters["replayed"] += len(chosen)
        return len(chosen)

    def purge(self) -> int:
        purged = 0
        for lst in self.levels:
            for entry in lst:
                if entry != BELL:
                    self.msgs[entry].state = "purged"
                    purged += 1
            lst.clear()
        for mid in self.delayed:
            self.msgs[mid].state = "purged"
            purged += 1
        self.delayed.clear()
        self.counters["purged"] += purged
        return purged


def _s(value: bytes) -> str:
    return value.decode("utf-8")


def _as_tuple(d: Delivery) -> tuple[str, bytes, str, int]:
    return (d.id, d.payload, d.token, d.deliveries)


@dataclass
class Call:
    """One settle call: ``kind`` and ``args`` name it as the core's request id does
    (``kind`` None: extend, which keeps no reply)."""

    kind: str | None
    args: tuple[str, ...]
    run: Callable[[], Any]  # on the consumer's current queue object
    model: Callable[[], Any]  # the model's transition; returns the expected reply

    def __repr__(self) -> str:
        return f"Call({self.kind}, {self.args})"


def _args(*args: Any) -> tuple[str, ...]:
    return tuple(str(a) for a in args)


@dataclass
class Held:
    consumer: int
    delivery: Delivery


REASONS = st.sampled_from(["", "boom", "bad input"])
BURY_REASONS = st.sampled_from(["malformed", "unknown task"])


class QueueMachine(RuleBasedStateMachine):
    """Two consumers (two ReliableQueue objects, as two processes) on one fresh queue."""

    client: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.name = f"model-{uuid.uuid4().hex[:12]}"
        self.qs: list[ReliableQueue] = []
        self.model: Model | None = None
        self.held: list[Held] = []  # deliveries a live consumer holds, unsettled
        self.pending: list[tuple[int, str]] = []  # BLMOVE-d entries not yet leased
        self.history: list[Delivery] = []  # every delivery ever handed out
        self.t0 = 0  # server ms (no skew) when the current step started
        self.step = 0  # steps so far; also 1 ms of skew each (see begin)
        self.next_id = 0
        self.sent: list[Call] = []  # settle calls made, for retries
        # (kind, args) -> (first reply, server ms just before and just after that call)
        self.replies: dict[tuple[Any, ...], tuple[Any, int, int]] = {}
        self.options: dict[str, Any] = {}
        self.door_ok = True  # see agrees_with_model
        self.last_plain: list[list[str]] = []
        self.blmoved = False

    # -- plumbing ------------------------------------------------------------------------

    @property
    def m(self) -> Model:
        assert self.model is not None
        return self.model

    def server_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def begin(self) -> None:
        """Start a step: every step adds 1 ms of skew, so scores written in different steps
        never tie; within one script call ties go by id, and ids count up (see
        deterministic_ids). Whatever the machine's speed, the order is the same on every
        run, which hypothesis needs to replay and shrink an example."""
        if self.model is not None:
            self.read_back_scores()  # of the previous operation, while t0 and step fit it
        self.step += 1
        self.set_skew()
        self.t0 = self.server_ms()

    def skew_ms(self) -> int:
        return self.m.now * TICK_MS + self.step

    def set_skew(self) -> None:
        for q in self.qs:
            q._scripts.skew_ms = self.skew_ms()

    def deterministic_ids(self, q: ReliableQueue) -> None:
        """Message ids m000001, m000002, ... instead of uuid4 (the id is the first argument
        of publish.lua; publish checks it came back)."""
        make_args = q._publish_args

        def publish_args(*args: Any, **kwargs: Any) -> list[Any]:
            out = make_args(*args, **kwargs)
            self.next_id += 1
            out[0] = f"m{self.next_id:06d}"
            return out

        q._publish_args = publish_args  # type: ignore[method-assign]

    def consumer(self) -> ReliableQueue:
        q = ReliableQueue(self.client, self.name, keeper=False, **self.options)
        self.deterministic_ids(q)
        return q

    def last_id(self) -> str:
        return f"m{self.next_id:06d}"

    def q_of(self, consumer: int) -> ReliableQueue:
        return self.qs[consumer]

    def took(
        self, consumer: int, got: list[Delivery], expected: list[tuple[str, bytes, str, int]]
    ) -> None:
        assert [_as_tuple(d) for d in got] == expected
        for d in got:
            assert 1 <= d.deliveries <= self.m.max_deliveries, d
            self.held.append(Held(consumer, d))
            self.history.append(d)

    def pick_held(self, data: st.DataObject, max_size: int) -> list[Held]:
        idx = data.draw(st.lists(st.integers(0, len(self.held) - 1), min_size=1, max_size=max_size))
        return [self.held[i] for i in idx]

    def settled(self, chosen: list[Held]) -> None:
        for h in chosen:
            if h in self.held:
                self.held.remove(h)

    @staticmethod
    def pairs(ds: list[Delivery]) -> list[tuple[str, str]]:
        return [(d.id, d.token) for d in ds]

    # -- setup ---------------------------------------------------------------------------

    @initialize(
        max_deliveries=st.integers(1, 3),
        floor=st.sampled_from([0.0, 0.0, 0.25, 0.5]),
        sweep_limit=st.sampled_from([1, 2, 128]),
        dead_max=st.sampled_from([2, 100]),
        stock=st.lists(st.tuples(st.binary(max_size=4), st.integers(0, 10)), max_size=6),
        steps=st.sampled_from(LEVELS),
    )
    def setup(
        self,
        steps: tuple[int, ...],
        max_deliveries: int,
        floor: float,
        sweep_limit: int,
        dead_max: int,
        stock: list[tuple[bytes, int]],
    ) -> None:
        """A fresh queue with two consumers (two queue objects, as two processes would
        have), and some messages already waiting."""
        self.options = dict(
            lease_ms=LEASE_TICKS * TICK_MS,
            max_deliveries=max_deliveries,
            priority_steps=steps,
            starvation_floor=floor,
            sweep_limit=sweep_limit,
            dead_letter_max=dead_max,
        )
        self.qs = [self.consumer(), self.consumer()]
        self.model = Model(
            steps=steps,
            max_deliveries=max_deliveries,
            floor_every=self.qs[0].config.floor_every,
            sweep_limit=sweep_limit,
            dead_max=dead_max,
        )
        self.begin()
        for payload, priority in stock:
            mid = self.qs[0].publish(payload, priority=priority)
            assert self.m.publish(mid, payload, self.m.level_of(priority), 0, None) is None

    def teardown(self) -> None:
        keys = list(self.client.scan_iter(match=f"belayq:{{{self.name}}}:*", count=1000))
        if keys:
            self.client.delete(*keys)

    # -- producing -----------------------------------------------------------------------

    @rule(
        items=st.lists(
            st.tuples(
                st.binary(max_size=6),
                st.integers(0, 10),  # priority
                st.sampled_from([0, 0, 0, 1, 2, 3]),  # delay, ticks
                st.sampled_from([None] * 8 + ["a", "b"]),  # dedup id
            ),
            min_size=1,
            max_size=4,
        ),
    )
    def publish(self, items: list[tuple[bytes, int, int, str | None]]) -> None:
        self.begin()
        for payload, priority, delay, dedup in items:
            mid = self.qs[0].publish(
                payload, priority=priority, delay_ms=delay * TICK_MS, dedup_id=dedup
            )
            first = self.m.publish(mid, payload, self.m.level_of(priority), delay, dedup)
            if first is not None:
                assert mid == first, "a deduplicated publish must answer the first id"
            else:
                assert mid == self.last_id()

    @rule(
        payloads=st.lists(st.binary(max_size=6), min_size=1, max_size=4),
        priority=st.integers(0, 10),
    )
    def publish_many(self, payloads: list[bytes], priority: int) -> None:
        self.begin()
        first = self.next_id + 1
        ids = self.qs[1].publish_many(payloads, priority=priority)
        assert ids == [f"m{i:06d}" for i in range(first, first + len(payloads))]
        for mid, payload in zip(ids, payloads, strict=True):
            assert self.m.publish(mid, payload, self.m.level_of(priority), 0, None) is None

    # -- consuming -----------------------------------------------------------------------

    @rule(consumer=st.integers(0, 1), count=st.integers(1, 5))
    def try_claim(self, consumer: int, count: int) -> None:
        self.begin()
        expected = self.m.claim(count)
        got, due_ms = self.q_of(consumer).try_claim(count)
        t1 = self.server_ms()
        if not self.m.delayed:
            assert due_ms == -1
        else:
            first = min((e[1], mid) for mid, e in self.m.delayed.items())[0]
            skew = self.skew_ms()
            lo, hi = first - t1 - skew, first - self.t0 - skew
            assert max(0, lo) <= due_ms <= max(0, hi), (due_ms, lo, hi)
        self.took(consumer, got, expected)

    @rule(consumer=st.integers(0, 1), count=st.integers(1, 5))
    def claim_nowait(self, consumer: int, count: int) -> None:
        self.begin()
        expected = self.m.claim(count)
        got = self.q_of(consumer).claim(timeout=0, count=count)
        self.took(consumer, got, expected)

    @precondition(lambda self: self.model is not None and self.m.levels[0])
    @rule(consumer=st.integers(0, 1))
    def blmove(self, consumer: int) -> None:
        """A blocking claimer's BLMOVE (level 1 -> processing), lease not yet registered."""
        self.begin()
        q = self.q_of(consumer)
        entry = self.client.execute_command(*q.blmove_command(0.001))
        self.blmoved = True
        expected = self.m.blmove()
        assert (None if entry is None else _s(entry)) == expected
        if expected is not None:
            self.pending.append((consumer, expected))

    @precondition(lambda self: self.pending)
    @rule(then_sweep=st.booleans())
    def stall(self, then_sweep: bool) -> None:
        """A claimer stalls between BLMOVE and lease.lua for a whole lease: the sweep gives
        its entry a provisional lease, which then expires."""
        self.sweep()
        self.advance(LEASE_TICKS, then_sweep)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), count=st.integers(1, 3))
    def lease_claimed(self, data: st.DataObject, count: int) -> None:
        """The claimer's lease.lua, possibly after the sweep already took the entry back."""
        self.begin()
        i = data.draw(st.integers(0, len(self.pending) - 1))
        consumer, entry = self.pending.pop(i)
        expected = self.m.lease(entry, count)
        got, _ = self.q_of(consumer).lease_claimed(entry.encode(), count)
        self.took(consumer, got, expected)

    # -- settling ------------------------------------------------------------------------

    def settle(self, call: Call) -> tuple[Any, bool]:
        """Run a settle call on the queue and in the model; returns (reply, repeated).

        The core keeps the reply of every ack/nack/bury/release call for REPLY_TTL_MS under
        a digest of the call, so an identical call (a retry) gets the first reply and changes
        nothing. The model keeps the same table."""
        key = (call.kind, call.args)
        before = self.server_ms()
        got = call.run()
        after = self.server_ms()
        kept = self.replies.get(key) if call.kind else None
        if kept is not None and after < kept[1] + REPLY_TTL_MS:
            self.m.counters["repeated_requests"] += 1
            expected, repeated = kept[0], True
        else:
            # The first reply must be surely kept or surely expired, or the model cannot tell.
            assume(kept is None or before > kept[2] + REPLY_TTL_MS)
            expected, repeated = call.model(), False
            if call.kind and REPLY_TTL_MS:
                self.replies[key] = (expected, before, after)
        assert got == expected, (call, got, expected)
        if call.kind:
            self.sent.append(call)
        return got, repeated

    def ack_call(self, c: int, ds: list[Delivery]) -> Call:
        pairs = self.pairs(ds)
        return Call(
            "ack",
            _args(*(x for p in pairs for x in p)),
            (lambda: [self.qs[c].ack(ds[0])])
            if len(ds) == 1
            else (lambda: self.qs[c].ack_many(ds)),
            lambda: self.m.ack(pairs),
        )

    def nack_call(self, c: int, d: Delivery, delay: int, reason: str) -> Call:
        return Call(
            "nack",
            _args(d.id, d.token, delay * TICK_MS, reason, "0"),
            lambda: self.qs[c].nack(d, delay_ms=delay * TICK_MS, reason=reason),
            lambda: self.m.nack(d.id, d.token, delay, reason, bury=False),
        )

    def bury_call(self, c: int, d: Delivery, reason: str) -> Call:
        return Call(
            "bury",
            _args(d.id, d.token, 0, reason, "1"),
            lambda: self.qs[c].dead_letter(d, reason),
            lambda: self.m.nack(d.id, d.token, 0, reason, bury=True) == "dead",
        )

    def release_call(self, c: int, ds: list[Delivery]) -> Call:
        pairs = self.pairs(ds)
        return Call(
            "rel",
            _args(*(x for p in pairs for x in p)),
            lambda: self.qs[c].release(ds),
            lambda: self.m.release(pairs),
        )

    def extend_call(self, c: int, ds: list[Delivery]) -> Call:
        pairs = self.pairs(ds)
        return Call(None, (), lambda: self.qs[c].extend(ds), lambda: self.m.extend(pairs))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        """ack / ack_many of held claims (some may have gone stale meanwhile)."""
        self.begin()
        chosen = self.pick_held(data, 3)
        self.settle(self.ack_call(chosen[0].consumer, [h.delivery for h in chosen]))
        self.settled(chosen)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), delay=st.sampled_from([0, 0, 1, 2]), reason=REASONS)
    def nack(self, data: st.DataObject, delay: int, reason: str) -> None:
        self.begin()
        [h] = self.pick_held(data, 1)
        self.settle(self.nack_call(h.consumer, h.delivery, delay, reason))
        self.settled([h])

    @precondition(lambda self: self.held)
    @rule(data=st.data(), reason=BURY_REASONS)
    def dead_letter(self, data: st.DataObject, reason: str) -> None:
        self.begin()
        [h] = self.pick_held(data, 1)
        self.settle(self.bury_call(h.consumer, h.delivery, reason))
        self.settled([h])

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        self.begin()
        chosen = self.pick_held(data, 3)
        ds = [h.delivery for h in chosen]
        self.settle(self.extend_call(chosen[0].consumer, ds))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.begin()
        chosen = self.pick_held(data, 3)
        self.settle(self.release_call(chosen[0].consumer, [h.delivery for h in chosen]))
        self.settled(chosen)

    @precondition(lambda self: self.history)
    @rule(data=st.data(), op=st.sampled_from(["ack", "nack", "dead_letter", "extend", "release"]))
    def stale_settle(self, data: st.DataObject, op: str) -> None:
        """A settle with a token that is not the message's current one (an old claim's, the
        sweep's provisional '0', or one for an unknown id) is refused and counted, and
        changes nothing."""
        self.begin()
        stale = [d for d in self.history if not self.m.valid(d.id, d.token)]
        forged = [Delivery(m.id, m.payload, "0", m.n, self.name) for m in self.m.live()] + [
            Delivery(f"no-such-id-{self.step}", b"", "1", 1, self.name)
        ]
        d = data.draw(st.sampled_from(stale + forged))
        assert not self.m.valid(d.id, d.token)
        c = data.draw(st.integers(0, 1))
        before = self.m.counters["stale_acks"]
        call = {
            "ack": lambda: self.ack_call(c, [d]),
            "nack": lambda: self.nack_call(c, d, 0, "late"),
            "dead_letter": lambda: self.bury_call(c, d, "late"),
            "extend": lambda: self.extend_call(c, [d]),
            "release": lambda: self.release_call(c, [d]),
        }[op]()
        got, repeated = self.settle(call)
        if not repeated:  # a re-sent call answers as the first one did (maybe a success)
            assert got in ([False], "stale", False, 0), got
            assert self.m.counters["stale_acks"] == before + 1

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def retry_settle(self, data: st.DataObject) -> None:
        """Re-send an earlier ack/nack/dead_letter/release exactly (redis-py retries after a
        dropped connection): the first reply again, and no change at all."""
        self.begin()
        self.settle(data.draw(st.sampled_from(self.sent)))

    # -- failures, upkeep, time ----------------------------------------------------------

    @precondition(lambda self: self.held or self.pending)
    @rule(consumer=st.integers(0, 1))
    def crash(self, consumer: int) -> None:
        """kill -9: the consumer's claims (and a BLMOVE it never leased) are forgotten
        unsettled, and a new process takes its place."""
        self.begin()
        self.held = [h for h in self.held if h.consumer != consumer]
        self.pending = [p for p in self.pending if p[0] != consumer]
        self.qs[consumer] = self.consumer()  # the restarted process
        self.set_skew()

    @rule()
    def sweep(self) -> None:
        self.begin()
        got = self.qs[0].sweep()
        expected = self.m.sweep()
        assert (
            got.ran,
            got.reclaimed,
            got.dead_lettered,
            got.adopted,
            got.promoted,
            got.orphans_found,
        ) == expected

    @rule(ticks=st.integers(1, 3), then_sweep=st.booleans())
    def advance(self, ticks: int, then_sweep: bool) -> None:
        """Time moves forward (whole ticks, on every queue object); then, maybe, a keeper's
        sweep runs."""
        self.begin()
        self.m.now += ticks
        self.set_skew()
        if then_sweep:
            self.sweep()

    @precondition(lambda self: self.model is not None and self.m.dead)
    @rule(data=st.data(), by_id=st.booleans(), limit=st.integers(1, 3))
    def replay_dead(self, data: st.DataObject, by_id: bool, limit: int) -> None:
        self.begin()
        ids: list[str] = []
        if by_id:
            known = [*self.m.dead, *self.m.msgs, "no-such-id"]
            ids = data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=3))
        got = self.qs[0].replay_dead(ids or None, limit=limit)
        assert got == self.m.replay(ids, limit)

    @precondition(lambda self: self.model is not None and len(self.m.msgs) >= 15)
    @rule()
    def purge(self) -> None:
        self.begin()
        assert self.qs[0].purge() == self.m.purge()

    # -- checks --------------------------------------------------------------------------

    def read_back_scores(self) -> None:
        """Record the scores the last operation wrote; check they are its now + duration."""
        keys = self.qs[0].keys
        t1 = self.server_ms()
        for zkey, entries in ((keys.leases, self.m.leases), (keys.delayed, self.m.delayed)):
            for mid, entry in entries.items():
                if entry[1] is None:
                    score = self.client.zscore(zkey, mid)
                    assert score is not None, (zkey, mid)
                    server_now = int(score) - entry[0] * TICK_MS - self.step
                    assert self.t0 <= server_now <= t1, (mid, server_now, self.t0, t1)
                    entry[1] = int(score)

    @invariant()
    def agrees_with_model(self) -> None:
        if self.model is None:
            return
        m, q = self.m, self.qs[0]
        keys = q.keys
        self.read_back_scores()

        pipe = self.client.pipeline(transaction=False)
        for lvl in keys.levels:
            pipe.lrange(lvl, 0, -1)
        pipe.lrange(keys.processing, 0, -1)
        pipe.zrange(keys.leases, 0, -1, withscores=True)
        pipe.zrange(keys.delayed, 0, -1, withscores=True)
        pipe.lrange(keys.dead, 0, -1)
        ids = list(m.msgs)
        for mid in ids:
            pipe.hgetall(keys.message(mid))
        reply = pipe.execute()
        nl = len(keys.levels)
        levels = [[_s(e) for e in lst] for lst in reply[:nl]]
        processing = [_s(e) for e in reply[nl]]
        leases = {_s(k): int(v) for k, v in reply[nl + 1]}
        delayed = {_s(k): int(v) for k, v in reply[nl + 2]}
        dead = [_s(e) for e in reply[nl + 3]]
        hashes = dict(zip(ids, reply[nl + 4 :], strict=True))

        # The contract on Redis itself, whatever the model thinks.
        where: Counter[str] = Counter()
        for lst in (*levels, processing, dead):
            where.update(e for e in lst if e != BELL)
        where.update(list(delayed))
        unlisted = set(leases) - set(processing)  # leased, yet not in processing
        where.update(unlisted)  # still in flight (the lease holds it)
        assert all(BELL not in lst for lst in levels[1:]), "a bell below level 1"
        assert set(where) <= set(m.msgs), f"unknown entries: {set(where) - set(m.msgs)}"
        for msg in m.msgs.values():
            if msg.state in LIVE:
                assert where[msg.id] == 1, f"{msg.id} ({msg.state}) is in {where[msg.id]} places"
                h = hashes[msg.id]
                assert h.get(b"p") == msg.payload, f"{msg.id} lost its payload"
                assert int(h.get(b"n", 0)) <= m.max_deliveries
            else:
                assert where[msg.id] == 0 and hashes[msg.id] == {}, msg
        assert not unlisted, f"leased but not in processing: {unlisted}"
        for mid in dead:
            reason = _s(hashes[mid].get(b"e", b""))
            assert reason.strip(), f"dead letter {mid} has no reason"

        # Bells are wake-up markers, not messages: the model takes their places in level 1
        # from Redis, and checks what they are for. At most one; and after every step that
        # moved ready work (but a bare BLMOVE, whose lease.lua would do it), level 1 is
        # non-empty whenever a lower level holds work, so a claimer blocked on it wakes.
        plain = [[e for e in lst if e != BELL] for lst in levels]
        assert levels[0].count(BELL) <= 1, levels[0]
        door = len(levels) < 2 or bool(levels[0]) or not any(levels[1:])
        if not self.blmoved and (self.door_ok or plain != self.last_plain):
            assert door, f"level 1 is empty while lower levels hold work: {levels}"
        self.door_ok, self.last_plain, self.blmoved = door, plain, False
        m.levels[0] = list(levels[0])

        # Exact agreement with the model.
        assert plain == [[e for e in lst if e != BELL] for lst in m.levels]
        assert processing == m.processing
        assert leases == {mid: e[1] for mid, e in m.leases.items()}
        assert delayed == {mid: e[1] for mid, e in m.delayed.items()}
        assert dead == m.dead
        for msg in m.msgs.values():
            if msg.state not in LIVE:
                continue
            h = hashes[msg.id]
            assert int(h[b"l"]) == msg.level and int(h[b"u"]) > 0
            assert int(h.get(b"n", 0)) == msg.n, msg
            assert (None if b"t" not in h else _s(h[b"t"])) == msg.token, msg
            assert (None if b"e" not in h else _s(h[b"e"])) == msg.err, msg
            assert (b"d" in h) == (msg.state == "dead"), msg
            if msg.id in m.leases:
                assert msg.state == "flight" and msg.token is not None
            if msg.state == "flight":
                assert msg.id in processing or msg.id in leases

        stats = q.stats()
        sizes = {k: stats.pop(k) for k in ("ready", "in_flight", "leased", "delayed", "dead")}
        assert stats.pop("schema") == 1
        assert sizes == {
            "ready": sum(len(lst) for lst in m.levels) - m.levels[0].count(BELL),
            "in_flight": len(m.processing),
            "leased": len(m.leases),
            "delayed": len(m.delayed),
            "dead": len(m.dead),
        }
        assert stats == dict(+m.counters)

        letters = q.dead_letters(limit=1000)
        assert [x.id for x in letters] == m.dead
        for x in letters:
            msg = m.msgs[x.id]
            assert (x.payload, x.reason, x.deliveries) == (msg.payload, msg.err, msg.n)
            assert x.dead_at_ms > 0


@pytest.mark.timeout(900)
def test_queue_matches_model(r: redis.Redis) -> None:
    class Machine(QueueMachine):
        client = r

    run_state_machine_as_test(Machine, settings=SETTINGS)


def test_late_lease_leaves_the_holders_claim_in_processing(
    r: redis.Redis, make_queue: Callable[..., ReliableQueue]
) -> None:
    """The sequence the model found (fixed in lease.lua): a claimer stalls between BLMOVE
    and lease.lua; the sweep gives its entry a provisional lease that expires; the entry
    goes back to ready and another consumer claims it. The late lease.lua is told it lost,
    and must not LREM the holder's entry from processing (it did: leased, not listed)."""
    a = make_queue(r, lease_ms=1_000)
    b = make_queue(r, lease_ms=1_000)
    msg_id = a.publish(b"x")
    entry = r.execute_command(*a.blmove_command(0.01))
    a.sweep()  # provisional lease
    for q in (a, b):
        q._scripts.skew_ms += 1_000
    [d] = b.claim(timeout=0)  # its pre-sweep puts the entry back; b claims it
    assert d.id == msg_id
    got, _ = a.lease_claimed(entry)
    assert got == []
    assert r.lrange(a.keys.processing, 0, -1) == [msg_id.encode()]
    s = a.stats()
    assert (s["in_flight"], s["leased"], s["lost_claims"]) == (1, 1, 1)
    assert s.get("duplicates_dropped", 0) == 0
    assert b.ack(d) is True
