"""The Lua transitions in ``lua/``, as belayq sends them: each script's full text (its
includes pasted once, dependencies first), its SHA1, its key roles (the ``KEYS[i] role``
lines of its contract block), the commands it may call, and the FUNCTION library that holds
them all.

Each script file is one transition and opens with its contract block. ``-- @include name``
lines name the ``lua/includes/name.lua`` it uses (each pasted once, its own includes first).
The ``KEYS[i] <role>`` lines are the script's key vector: the runner reads them, so the keys
each script is given and the keys its header names cannot drift apart.

The commands a script may call are read from its text (every ``redis.call('NAME'``), so the
ACL check each script makes before its first write (lua/includes/check.lua) cannot drift
from what it runs. A command called only inside a function marked ``-- @when history`` is
checked only when the history is on; ``redis.call(EVENTS`` is the events' PUBLISH or
SPUBLISH, checked on the queue's channel only when events are on.

A ``-- FLAGS:`` line of the contract block declares how a script meets a full server
(``maxmemory``): ``allow-oom`` (it frees memory or keeps a claim alive: it runs),
``no-writes`` (read-only: it runs, on a replica too), or none (it stores more: refused
whole). Library functions are registered with those flags. A script run with EVALSHA has
none, and Redis refuses a deny-oom command under maxmemory only while the script has
written nothing (``scriptVerifyOOM`` in Redis 7, ``luaRedisGenericCommand`` in 6.2): so an
``allow-oom`` script's first command is a write that changes nothing and is not deny-oom
(``ZREM`` of a member no id can be), and a script without flags starts with one that is
deny-oom (``ZADD XX`` of that member), which a full server refuses before anything.

A ``-- MEMO:`` line of the contract block declares how a call sent again after its reply was
lost (redis-py re-sends the same command, so the same request id) answers as its first run
did and changes nothing more: ``reply`` (the script keeps its reply in the queue's memo,
includes/memo.lua, and needs the ``memo`` and ``memo_exp`` keys; the runner gives every call
of it a fresh request id unless the caller names one), or ``none (<why>)`` (a re-send finds
nothing left to do and answers as the first run did). Every script that writes declares
one; a read-only script (``no-writes``) needs none."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)
_CALL = re.compile(r"redis\.p?call\(([^,)]*)")
_LITERAL = re.compile(r"^'([A-Z]+)'$|'([A-Z]+)'")
_FUNCTION = re.compile(r"^local function (\w+)\(")
_NAME = re.compile(r"\b(\w+)\s*\(")
_WHEN = re.compile(r"^-- @when (history)$")
_FLAGS = re.compile(r"^-- FLAGS: ([\w-]+(?: [\w-]+)*)", re.MULTILINE)
_MEMO = re.compile(r"^-- MEMO: (reply|none \(.+)", re.MULTILINE)
FLAGS = ("allow-oom", "no-writes")
#: A zset member no message id can be (ids hold no NUL byte).
_PROBE_MEMBER = "'\\0belayq:probe'"
_KEY = re.compile(r"KEYS\[(\d+)(\.\.)?\]\s+(\w+)")
_SAME_KEYS = re.compile(r"^-- KEYS: as (\w+)\.lua", re.MULTILINE)
SCRIPT_NAMES = (
    "publish",
    "claim",
    "lease",
    "ack",
    "nack",
    "extend",
    "release",
    "defer",
    "sweep",
    "replay",
    "purge",
    "promote",
    "discard",
    "drop",
    "stats",
    "pause",
    "resume",
    "register",
    "lead",
    "resign",
)
def _lua_dir() -> Any:
    return resources.files("belayq") / "lua"


def _text(path: Any) -> str:
    return str(path.read_text(encoding="utf-8"))


def _own_text(name: str) -> str:
    """Script ``name``'s own statements (its file without the include lines)."""
    return _INCLUDE.sub("", _text(_lua_dir() / f"{name}.lua"))


def _includes(text: str, done: list[str]) -> list[str]:
    """Append to ``done`` the includes ``text`` names, not yet in it, dependencies first."""
    for inc in _INCLUDE.findall(text):
        if inc not in done:
            _includes(_text(_lua_dir() / "includes" / f"{inc}.lua"), done)
            done.append(inc)
    return done


def _pasted(includes: list[str]) -> str:
    return "\n".join(
        _INCLUDE.sub("", _text(_lua_dir() / "includes" / f"{inc}.lua")) for inc in includes
    )


def _functions(name: str) -> dict[str, tuple[str | None, str]]:
    """The top-level functions of script ``name``'s includes: name -> (its ``@when`` mark
    or None, its text). Each opens with ``local function`` and closes with an ``end`` at the
    start of a line."""
    out: dict[str, tuple[str | None, str]] = {}
    current: list[str] | None = None
    fname, when, marked = "", None, None
    for inc in _includes(_text(_lua_dir() / f"{name}.lua"), []):
        for line in _text(_lua_dir() / "includes" / f"{inc}.lua").splitlines():
            found = _WHEN.match(line)
            opened = _FUNCTION.match(line)
            if found:
                marked = found.group(1)
            elif opened and current is None:
                fname, when, marked, current = opened.group(1), marked, None, [line]
            elif current is not None:
                current.append(line)
                if line == "end":
                    out[fname] = (when, "\n".join(current))
                    current = None
            elif _CALL.search(line):
                raise ValueError(f"includes/{inc}.lua: redis.call outside a function: {line}")
    return out


def _calls(text: str, where: str) -> tuple[set[str], bool]:
    """The commands ``redis.call`` runs in ``text``, and whether it publishes events."""
    names: set[str] = set()
    events = False
    for expr in _CALL.findall(text):
        expr = expr.strip()
        if expr == "EVENTS":
            events = True
            continue
        found = [a or b for a, b in _LITERAL.findall(expr)]
        if not found:
            raise ValueError(f"{where}: cannot tell which command redis.call({expr} runs")
        names.update(found)
    return names, events


@cache
def flags(name: str) -> tuple[str, ...]:
    """The flags script ``name`` declares in its contract block (``-- FLAGS: ...``; ``none``
    says it has none).

    Raises:
        ValueError: An unknown flag.
    """
    found = _FLAGS.search(_text(_lua_dir() / f"{name}.lua"))
    declared = tuple(found.group(1).split()) if found else ()
    if declared == ("none",):
        declared = ()
    unknown = set(declared) - set(FLAGS)
    if unknown:
        raise ValueError(f"{name}.lua: unknown FLAGS {sorted(unknown)}; known: {FLAGS}")
    return declared


@cache
def memoized(name: str) -> bool:
    """Whether script ``name`` keeps a reply memo (``-- MEMO: reply`` in its contract block),
    so that each call of it needs a request id.

    Raises:
        ValueError: A script that writes and declares no ``MEMO``, or one that declares
            ``reply`` without the memo's keys or its include.
    """
    text = _text(_lua_dir() / f"{name}.lua")
    found = _MEMO.search(text)
    if found is None:
        if "no-writes" in flags(name):
            return False
        raise ValueError(f"{name}.lua writes but declares no '-- MEMO: reply' or "
                         "'-- MEMO: none (<why a re-send changes nothing>)'")
    if found.group(1) != "reply":
        return False
    roles = key_roles(name)
    if "memo" not in roles or "memo_exp" not in roles or "memo" not in _includes(text, []):
        raise ValueError(f"{name}.lua keeps a reply memo: it needs the memo and memo_exp keys "
                         "and '-- @include memo'")
    return True


def _probe(name: str) -> str:
    """The first command of script ``name`` run as a script (see the module's doc)."""
    declared = flags(name)
    if "no-writes" in declared:
        return ""
    roles = key_roles(name)
    zset = next((r for r in ("leases", "delayed", "dead") if r in roles), None)
    if zset is None:
        raise ValueError(f"{name}.lua writes but has no zset key (leases, delayed, dead)")
    key = f"KEYS[{roles.index(zset) + 1}]"
    if "allow-oom" in declared:
        return f"redis.call('ZREM', {key}, {_PROBE_MEMBER})"
    return f"redis.call('ZADD', {key}, 'XX', 0, {_PROBE_MEMBER})"


@cache
def commands(name: str, *, function: bool = False) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """The commands script ``name`` may call, read from its text: ``(always, history,
    events)``: those of every call, those only of a call with the history on, and whether
    it publishes events. Only the functions its own statements reach count, and the first
    command of its script form unless ``function``.

    Raises:
        ValueError: A ``redis.call`` whose command cannot be read from the text.
    """
    functions = _functions(name)
    own = _own_text(name) + ("" if function else "\n" + _probe(name))
    always, events = _calls(own, f"{name}.lua")
    history: set[str] = set()
    seen: set[str] = set()
    todo = [f for f in _NAME.findall(_own_text(name)) if f in functions]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        when, text = functions[f]
        found, publishes = _calls(text, f"{name}.lua ({f})")
        (history if when == "history" else always).update(found)
        events = events or publishes
        todo += [g for g in _NAME.findall(text) if g in functions and g != f]
    return tuple(sorted(always)), tuple(sorted(history - always)), events


def _lua_list(names: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"'{n}'" for n in names) + "}"


def _preamble(name: str, *, function: bool = False) -> str:
    """What runs before script ``name``'s own statements: the common arguments read and
    checked, the key vector checked against the roles of its contract block, the caller's
    ACL checked for every command this call may run (lua/includes/check.lua), and, as a
    script, its first command (:func:`_probe`)."""
    roles = key_roles(name)
    fixed = sum(1 for r in roles if r != "levels")
    levels = "true" if "levels" in roles else "false"
    always, history, events = commands(name, function=function)
    if events and "stats" not in roles:
        raise ValueError(f"{name}.lua publishes events but has no stats key to name the channel")
    channel = f"events_channel(KEYS[{roles.index('stats') + 1}])" if events else "nil"
    return (
        f"read_context()\ncheck_keys({fixed}, {levels})\n"
        f"check_acl('{name}', {_lua_list(always)}, HISTORY_MAX > 0 and {_lua_list(history)}, "
        f"{'EVENTS' if events else 'false'}, {channel})"
        + ("" if function else "\n" + _probe(name))
    )


def _compact(text: str) -> str:
    """``text`` without its comment lines and blank lines: what Redis hashes, parses and
    receives (an RQ ack sends its script's text inside every transaction) halves."""
    return "\n".join(
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("--")
    ) + "\n"


@cache
def source(name: str) -> str:
    """The full text of script ``name``: its includes (each once, dependencies first), the
    preamble (the common arguments read, every check that needs no state), then its own
    statements."""
    includes = _includes(_text(_lua_dir() / f"{name}.lua"), [])
    if "context" not in includes:
        raise ValueError(f"{name}.lua must include context (directly or not)")
    memoized(name)  # a script that writes says how a re-send of it answers
    return _compact(f"{_pasted(includes)}\n{_preamble(name)}\n{_own_text(name)}")


@cache
def sha(name: str) -> str:
    """SHA1 of script ``name`` as Redis computes it for EVALSHA."""
    return hashlib.sha1(source(name).encode("utf-8")).hexdigest()


@cache
def library() -> tuple[str, str]:
    """belayq's Redis FUNCTION library: ``(name, code)``. The includes are defined once, when
    the library loads, not on every call as a script's are; each script is a function
    ``<library name>_<script>`` that sets KEYS and ARGV and runs the script's statements.
    The name carries a digest of the code, so two versions of belayq can share a server."""
    includes: list[str] = []
    for name in SCRIPT_NAMES:
        _includes(_text(_lua_dir() / f"{name}.lua"), includes)
    parts = ["local KEYS, ARGV", _pasted(includes)]
    for name in SCRIPT_NAMES:
        parts.append(f"local function script_{name}()\n{_own_text(name)}\nend")
    body = "\n".join(parts)
    lib = "belayq_" + hashlib.sha1(body.encode("utf-8")).hexdigest()[:12]
    registrations = "\n".join(
        f"redis.register_function{{function_name = '{lib}_{name}', "
        f"flags = {_lua_list(flags(name))}, callback = function(keys, args)\n"
        f"  KEYS, ARGV = keys, args\n{_preamble(name, function=True)}\n"
        f"  return script_{name}()\nend}}"
        for name in SCRIPT_NAMES
    )
    return lib, f"#!lua name={lib}\n{_compact(body)}{registrations}\n"


@cache
def key_roles(name: str) -> tuple[str, ...]:
    """The key roles of script ``name`` in KEYS order, from its contract block; ``levels``
    (always last) stands for every ready list."""
    text = (_lua_dir() / f"{name}.lua").read_text(encoding="utf-8")
    same = _SAME_KEYS.search(text)
    if same:
        return key_roles(same.group(1))
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    roles: dict[int, str] = {}
    for index, rest, role in _KEY.findall(header):
        roles[int(index)] = role
        if rest and role != "levels":
            raise ValueError(f"{name}.lua: only 'levels' may take KEYS[{index}..]")
    order = [roles[i] for i in sorted(roles)]
    if sorted(roles) != list(range(1, len(roles) + 1)):
        raise ValueError(f"{name}.lua: KEYS roles are not numbered 1..n: {roles}")
    return tuple(order)


def script_of(command: Sequence[Any]) -> str | None:
    """The name of the belayq transition a command (as given to ``execute_command``) runs:
    an EVALSHA of one of the scripts, or an FCALL of the library; else None."""
    if len(command) < 2:
        return None
    verb = command[0].decode() if isinstance(command[0], bytes) else str(command[0])
    target = command[1].decode() if isinstance(command[1], bytes) else str(command[1])
    if verb.upper() == "EVALSHA":
        return next((n for n in SCRIPT_NAMES if sha(n) == target), None)
    prefix = library()[0] + "_"
    if verb.upper() == "FCALL" and target.startswith(prefix):
        return target[len(prefix) :]
    return None


#: The commands that run belayq's transitions, as INFO commandstats names them.
SCRIPT_COMMANDS = ("evalsha", "fcall")


def _built_before_fork() -> None:
    """Build every script's text and the library in the parent of a fork: a child (an RQ
    work horse, a Celery pool process) then inherits them instead of reading and assembling
    the Lua files again, which a work horse would do for every job it runs."""
    for name in SCRIPT_NAMES:
        sha(name)
    library()


os.register_at_fork(before=_built_before_fork)
