"""What the product says speaks of the product and its users, never of how it is worked on.

The README, the docs, the packages' readmes, every docstring and string literal of the
shipped code (error messages, help texts, log lines) and the help of every ``belayq``
command are read for words that belong in the project's history (git and the changelog):
an "issue", a "seed", a "stop" or a "session" of work, and commit hashes used as dates.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "core" / "src", ROOT / "plugins" / "kombu" / "src",
           ROOT / "plugins" / "rq" / "src", ROOT / "examples"]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
         *sorted(ROOT.glob("*/README.md")), *sorted(ROOT.glob("plugins/*/README.md"))]  # fmt: skip

INSIDER = re.compile(
    r"\bseeds?\b|\bseed's\b"  # the documents the project grew from
    r"|\b(?:this|the|that|an?|our) issue\b|\bissues? #?\d+|\bissue's\b"  # the work's tracker
    r"|\b(?:this|the|that|a|each|every) stop\b|\bstop's\b|\bstops? \d+"  # a unit of the work
    r"|\b(?:this|the|that|same|a|each|every) session\b|\bsession's\b"
    r"|\b(?:at|on|before|after|since|until|as of) [0-9a-f]{7,40}\b",  # a commit hash as a date
    re.IGNORECASE,
)


def offences(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if INSIDER.search(line)]


def test_the_pattern_catches_what_it_is_for() -> None:
    for said in ("the seed's demo", "as the issue asks", "this stop's clean-clone run",
                 "run at 5fb9834", "measured in the same session", "issue 20"):  # fmt: skip
        assert offences(said), said
    for fine in ("a worker stops on a Redis error", "the Redis session cookie",
                 "an open issue of Celery", "seeded, the same schedule",
                 "stop the producers"):  # fmt: skip
        assert not offences(fine), fine


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_pages_speak_to_users(page: Path) -> None:
    assert not offences(page.read_text()), page


def shipped_strings() -> list[tuple[str, int, str]]:
    found = []
    for src in SOURCES:
        for path in sorted(src.rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.append((str(path.relative_to(ROOT)), node.lineno, node.value))
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if line.lstrip().startswith("#:"):  # attribute docs, shown by the API pages
                    found.append((str(path.relative_to(ROOT)), i, line))
        for path in sorted(src.rglob("*.lua")):
            found.append((str(path.relative_to(ROOT)), 1, path.read_text()))  # error texts
    return found


def test_shipped_code_speaks_to_users() -> None:
    strings = shipped_strings()
    assert len(strings) > 1000  # the walk found the code
    bad = [f"{path}:{line}: {said}" for path, line, text in strings for said in offences(text)]
    assert not bad, "\n".join(bad)


def commands() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "belayq", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout  # fmt: skip
    section = out.partition("\ncommands:\n")[2].partition("\n\n")[0]  # one line each
    names = re.findall(r"^ {4}([a-z][a-z_-]*)\b", section, re.M)
    assert names, out
    return names


def test_every_commands_help_speaks_to_users() -> None:
    names = commands()
    assert {"queues", "purge", "drop", "replay", "dashboard"} <= set(names)
    for argv in (["--help"], *([name, "--help"] for name in names)):
        out = subprocess.run([sys.executable, "-m", "belayq", *argv], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, (argv, out.stderr)
        assert not offences(out.stdout), (argv, offences(out.stdout))
    kombu = subprocess.run([sys.executable, "-m", "belayq_kombu", "--help"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert kombu.returncode == 0 and not offences(kombu.stdout), kombu.stdout
