"""The Lua transitions in ``lua/``, as belayq sends them: each script's full text (its
includes pasted once, dependencies first), its SHA1, its key roles (the ``KEYS[i] role``
lines of its contract block), and the FUNCTION library that holds them all.

Each script file is one transition and opens with its contract block. ``-- @include name``
lines name the ``lua/includes/name.lua`` it uses (each pasted once, its own includes first).
The ``KEYS[i] <role>`` lines are the script's key vector: the runner reads them, so the keys
each script is given and the keys its header names cannot drift apart."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)
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
    "drop",
    "stats",
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


def _preamble(name: str) -> str:
    """What runs before script ``name``'s own statements, as a script and as a function:
    the common arguments read and checked, and the key vector checked against the roles of
    its contract block (lua/includes/check.lua)."""
    roles = key_roles(name)
    fixed = sum(1 for r in roles if r != "levels")
    levels = "true" if "levels" in roles else "false"
    return f"read_context()\ncheck_keys({fixed}, {levels})"


@cache
def source(name: str) -> str:
    """The full text of script ``name``: its includes (each once, dependencies first), the
    preamble (the common arguments read, every check that needs no state), then its own
    statements."""
    includes = _includes(_text(_lua_dir() / f"{name}.lua"), [])
    if "context" not in includes:
        raise ValueError(f"{name}.lua must include context (directly or not)")
    return f"{_pasted(includes)}\n{_preamble(name)}\n{_own_text(name)}"


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
        f"redis.register_function('{lib}_{name}', function(keys, args)\n"
        f"  KEYS, ARGV = keys, args\n{_preamble(name)}\n  return script_{name}()\nend)"
        for name in SCRIPT_NAMES
    )
    return lib, f"#!lua name={lib}\n{body}\n{registrations}\n"


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
