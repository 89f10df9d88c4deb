"""The commands the README and the docs show, read out of their pages.

A command is a line of a shell code block (``bash``, ``sh``, ``console`` or a bare block)
that starts with a program a user runs, with any ``$ `` prompt and trailing ``# comment``
taken off, or an inline code span that is a whole command: one that starts with ``uv run``,
``python -m``, ``pip install`` or ``belayq`` and names a server (``--url``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

PROGRAMS = re.compile(
    r"^(?:uv run|uvx|python3? |pip install|belayq |rq |celery |sudo |bash |curl |redis-cli "
    r"|redis-server |tox |git |mkdocs |docker |kubectl )"
)
WHOLE_INLINE = re.compile(r"^(?:uv run |python3? -m |pip install |belayq \S+ .*--url)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Command:
    page: str
    line: str
    python: bool = False  # a python code block, kept whole


def shell_line(raw: str) -> str:
    line = raw.strip().removeprefix("$ ")
    return " ".join(re.split(r"\s+#\s", line, maxsplit=1)[0].split())


def shell_lines(body: str) -> list[str]:
    """The commands of a shell block: its prompted lines when it shows a session with
    output, else every line."""
    lines = body.splitlines()
    if any(line.startswith("$ ") for line in lines):
        lines = [line for line in lines if line.startswith("$ ")]
    return [c for c in map(shell_line, lines) if PROGRAMS.match(c)]


def read(page: Path) -> list[Command]:
    text = page.read_text()
    name = str(page.relative_to(ROOT))
    found: list[Command] = []
    for fence in FENCE.finditer(text):
        lang, body = fence.group(1), fence.group(2)
        if lang == "python":
            found.append(Command(name, body, python=True))
        elif lang in ("bash", "sh", "console", "shell", ""):
            found += [Command(name, c) for c in shell_lines(body)]
    prose = FENCE.sub("", text)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if WHOLE_INLINE.match(span.strip()):
            found.append(Command(name, shell_line(span)))
    return found


def documented() -> list[Command]:
    return [c for page in PAGES for c in read(page)]
