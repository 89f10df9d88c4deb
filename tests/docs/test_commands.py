"""Every command the README and the docs show is run here, or by the test named for it, or
carries the reason it is not run.

``RULES`` says, for each kind of documented command, which of the three holds. A command no
rule covers fails the first test: a new page or example needs its rule."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from belayq.embedded import RedisServer
from tests.conftest import client_of
from tests.core.test_cli import three_queues
from tests.docs.commands import ROOT, Command, documented


@dataclass(frozen=True)
class Rule:
    pattern: str
    run: str = ""  # "cli": run here against a server with queues; "help": `<cmd> --help` here
    by: tuple[str, str] = ("", "")  # (test file, what it runs): that test runs the command
    why: str = ""  # why it is not run


RULES = [
    Rule(r"^belayq (queues|stats|inspect|delayed|dead|history|watch|replay|purge|pause|resume) "
         r"--url "
         r"(\.\.\.|redis://)[^\[|]*$", run="cli"),
    Rule(r"^(uv run )?(python -m )?belayq( --help)?$", run="help"),
    Rule(r"^belayq (\w+ )?--(url URL|web)\b.*[\[(]",
         by=("tests/core/test_cli_help.py", '"--help"')),
    Rule(r"^belayq upgrade ", by=("tests/core/test_upgrade.py", '"upgrade"')),
    Rule(r"^belayq dashboard ", by=("tests/web/test_dashboard.py", '"dashboard"')),
    Rule(r"^belayq exporter ", by=("tests/core/test_metrics.py", '"exporter"')),
    Rule(r"^(uv run )?belayq demo --web", by=("tests/web/test_demo_stop.py", '"demo"')),
    Rule(r"^python -m belayq_kombu( rollback)?$", by=("tests/plugins/kombu/test_migration.py",
                                                    '"rollback"')),
    Rule(r"^python -m belayq_kombu replay$", by=("tests/plugins/kombu/test_transport.py",
                                               '"replay"')),
    Rule(r"^python -m belayq_kombu (stats|dead-letters)", run="kombu"),
    Rule(r"^rq worker -w belayq_rq\.Worker", by=("tests/plugins/rq/test_crash.py",
                                                 'worker_class="belayq_rq.Worker"')),
    Rule(r"^rq worker -c settings", by=("tests/sentinel/test_rq_failover.py", '"-c"')),
    Rule(r"^uv run examples/demo\.py", by=("tests/examples/test_examples.py", '"demo.py"')),
    Rule(r"^uv run examples/celery_app\.py", by=("tests/plugins/kombu/test_example.py",
                                                 '"celery_app.py"')),
    Rule(r"^uv run examples/rq_app\.py", by=("tests/plugins/rq/test_example.py",
                                             '"rq_app.py"')),
    Rule(r"^uv run examples/dramatiq_app\.py", by=("tests/plugins/dramatiq/test_example.py",
                                                   '"dramatiq_app.py"')),
    Rule(r"^pip install \./core \./plugins/kombu \./plugins/rq \./plugins/dramatiq$",
         by=("tests/dist/test_wheels.py", "plugins")),
    Rule(r"^pip install (\"?belayq\[|belayq-kombu$|belayq-rq$|belayq-dramatiq$)",
         why="installs from PyPI; tests/dist installs the same distributions from their wheels"),
    Rule(r"^pip install uv$", why="installs the tool the other commands run with"),
    Rule(r"^uv run mkdocs serve$", why="serves until stopped; tests/docs/test_site.py builds "
         "the same site in strict mode"),
    Rule(r"^uv run pytest", run="pytest"),
    Rule(r"^(uv run )?python -m benchmarks\.", run="bench"),
    Rule(r"^(uv run )?python -m tests\.matrix\.run_matrix", by=(
        "tests/matrix/test_matrix.py", "run_matrix")),
    Rule(r"^uv run python -m tests\.web\.screenshots docs/img$",
         why="runs the browser tests (tests/web/test_page*.py, run with the suite), keeping "
         "their screenshots in docs/img"),
    Rule(r"^uv run python tests/plugins/dramatiq/peer/run_dramatiq_suite\.py",
         by=("tests/plugins/dramatiq/test_dramatiq_peer_suite.py", '"dramatiq-peer"')),
    Rule(r"^uv run python tests/plugins/kombu/run_celery_suite\.py$",
         why="Celery's own integration suite, about an hour; its results are in docs/celery.md"),
]


def rule_for(command: Command) -> Rule | None:
    return next((r for r in RULES if re.search(r.pattern, command.line)), None)


COMMANDS = [c for c in documented() if not c.python]
PYTHON = [c for c in documented() if c.python]


def test_every_documented_command_has_a_rule() -> None:
    assert len(COMMANDS) > 50 and len(PYTHON) > 10  # the pages were read
    orphans = [f"{c.page}: {c.line}" for c in COMMANDS if rule_for(c) is None]
    assert not orphans, "documented commands no rule covers:\n" + "\n".join(orphans)


def test_the_tests_named_for_commands_run_them() -> None:
    for rule in RULES:
        path, needle = rule.by
        if path:
            assert needle in (ROOT / path).read_text(), (rule.pattern, path, needle)


@pytest.fixture
def url(private_redis: RedisServer) -> Iterator[str]:
    with client_of(private_redis) as c:
        c.flushall()
        _, kombu, _ = three_queues(c)
        kombu.publish(b'{"headers": {"task": "proj.fails", "id": "t-2"}, "body": "e30="}')
        for d in kombu.claim(timeout=0, count=2):
            kombu.dead_letter(d, "shown by the dead-letter commands")
        kombu.publish(b'{"headers": {"task": "proj.add", "id": "t-3"}, "body": "e30="}')
    yield f"redis://127.0.0.1:{private_redis.port}/0"


def test_the_documented_belayq_commands_run(url: str) -> None:
    ran = 0
    for c in COMMANDS:
        rule = rule_for(c)
        if rule is None or rule.run != "cli":
            continue
        line = re.sub(r"--url (\.\.\.|redis://\S+)", f"--url {url}", c.line)
        argv = [("celery" if a == "QUEUE" else a) for a in shlex.split(line)[1:]]
        if argv[0] == "watch":
            argv += ["--count", "1", "--interval", "0.1"]
        out = subprocess.run([sys.executable, "-m", "belayq", *argv], input="n\n",
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "Traceback" not in out.stderr, (c, out.stderr)
        if argv[0] in ("queues", "stats", "inspect", "delayed", "dead", "watch"):
            assert out.returncode == 0 and out.stdout.strip(), (c, out.stdout, out.stderr)
        else:  # replay, purge, pause, resume: "nothing matched" may be told apart; purge asks
            confirm = out.returncode == 2 and "--yes" in out.stderr
            assert out.returncode in (0, 1) or confirm, (c, out.returncode, out.stderr)
        ran += 1
    assert ran >= 10
    # Each read command saw the queues it was pointed at, not only a header.
    with redis.Redis.from_url(url) as client:
        assert client.llen("celery") >= 1  # nothing above deleted the kombu queue (answer "n")


def test_the_documented_kombu_commands_run(url: str) -> None:
    """``python -m belayq_kombu``'s read commands, each spelling the docs show (a usage line
    names several: ``stats|dead-letters``), on a local server (a cluster's URL becomes it)."""
    ran = set()
    for c in COMMANDS:
        rule = rule_for(c)
        if rule is None or rule.run != "kombu":
            continue
        for sub in shlex.split(c.line)[3].split("|"):
            if sub not in ("stats", "dead-letters"):
                continue  # replay and rollback write: their own tests run them
            out = subprocess.run([sys.executable, "-m", "belayq_kombu", sub, "--url", url,
                                  "--queue", "celery"], capture_output=True, text=True,
                                 timeout=60)  # fmt: skip
            assert out.returncode == 0 and out.stdout.strip(), (c, out.stderr)
            ran.add(sub)
    assert ran == {"stats", "dead-letters"}


def test_the_documented_help_commands_answer() -> None:
    for c in COMMANDS:
        rule = rule_for(c)
        if rule is not None and rule.run == "help":
            out = subprocess.run([sys.executable, "-m", "belayq", "--help"],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            assert out.returncode == 0 and "queues" in out.stdout


def test_the_documented_test_paths_exist() -> None:
    for c in COMMANDS:
        rule = rule_for(c)
        if rule is not None and rule.run == "pytest":
            paths = [a for a in shlex.split(c.line)[2:] if a.startswith("tests")]
            for path in paths:
                assert (ROOT / path.split("::")[0]).exists(), (c, path)


def test_the_documented_benchmarks_exist_and_answer_help() -> None:
    """Benchmarks take minutes and print figures (docs/benchmarks.md); they run outside CI.
    Here each documented module must exist and its ``--help`` answer."""
    modules = set()
    for c in COMMANDS:
        rule = rule_for(c)
        if rule is not None and rule.run == "bench":
            modules.add(re.search(r"-m (benchmarks[\w.]*)", c.line).group(1))  # type: ignore[union-attr]
    assert len(modules) >= 6
    for module in sorted(modules):
        out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0 and "usage" in out.stdout.lower(), (module, out.stderr[-500:])


@pytest.mark.parametrize("block", PYTHON, ids=[f"{c.page}-{i}" for i, c in enumerate(PYTHON)])
def test_documented_python_is_python(block: Command) -> None:
    """Every python block parses. The blocks are fragments of an app (its settings, a class):
    what each shows is run by the tests of its page's subject."""
    compile(block.line, block.page, "exec")


def test_the_readmes_python_runs(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's Celery app and core example run as they are, against a server of the
    test's (they name localhost:6379)."""
    port = private_redis.port
    blocks = [c.line for c in PYTHON if c.page == "README.md"]
    assert len(blocks) >= 2
    with client_of(private_redis) as c:
        c.flushall()
    real = redis.Redis

    class Local(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("port", port)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(redis, "Redis", Local)
    printed: list[object] = []
    for block in blocks:
        code = block.replace("localhost:6379", f"127.0.0.1:{port}")
        exec(compile(code, "README.md", "exec"), {"print": printed.append})
    assert printed == [b"hello"]
