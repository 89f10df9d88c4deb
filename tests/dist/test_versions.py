"""The four distributions say one version, the adapters pin the core to it, the packages
report it, the changelog has its entry, and each distribution ships the repository's
licence. Read from the sources (no build): tests/dist/test_wheels.py checks the built
distributions."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

import belayq
import belayq_dramatiq
import belayq_kombu
import belayq_rq
from belayq import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = {"belayq": ROOT / "core", "belayq-kombu": ROOT / "plugins/kombu",
            "belayq-rq": ROOT / "plugins/rq", "belayq-dramatiq": ROOT / "plugins/dramatiq"}


def project(name: str) -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads((PROJECTS[name] / "pyproject.toml").read_text())
    return table["project"]


def version() -> str:
    return str(project("belayq")["version"])


def test_one_version_pinned_exactly_and_reported_by_every_package() -> None:
    assert {name: project(name)["version"] for name in PROJECTS} == dict.fromkeys(
        PROJECTS, version())
    for adapter in ("belayq-kombu", "belayq-rq", "belayq-dramatiq"):
        core_pins = [d for d in project(adapter)["dependencies"] if re.match(r"belayq\b", d)]
        assert core_pins == [f"belayq=={version()}"], adapter
    assert [belayq.__version__, belayq_kombu.__version__, belayq_rq.__version__,
            belayq_dramatiq.__version__] == [version()] * 4
    assert {name: metadata.version(name) for name in PROJECTS} == dict.fromkeys(
        PROJECTS, version())


def test_the_changelog_has_the_version_its_link_and_the_schema() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "https://keepachangelog.com/en/1.1.0/" in text
    assert "## [Unreleased]" in text
    assert re.search(rf"^## \[{re.escape(version())}\] - \d{{4}}-\d\d-\d\d$", text, re.M)
    assert re.search(rf"^\[{re.escape(version())}\]: https://\S+$", text, re.M)
    assert f"belayq.SCHEMA_VERSION == {SCHEMA_VERSION}" in text
    for entry in re.findall(r"^## \[([^\]]+)\]", text, re.M):
        assert re.search(rf"^\[{re.escape(entry)}\]: https://", text, re.M), entry


def test_every_distribution_ships_the_repository_licence() -> None:
    licence = (ROOT / "LICENSE").read_bytes()
    assert licence.startswith(b"MIT License")
    for name, path in PROJECTS.items():
        table = project(name)
        assert (table["license"], table["license-files"]) == ("MIT", ["LICENSE"]), name
        assert (path / "LICENSE").read_bytes() == licence, f"{name}: a stale copy"
        assert (path / table["readme"]).is_file(), name
