"""``belayq`` for someone using it the first time: ``belayq --help`` sums up every command in
a line, each command's help says what it does, its arguments, an example and its exit
status; a listing says when what it reads is off (no history kept, failures recorded by the
framework) or empty; and the exit status tells a script what happened: 0 done, 1 nothing
matched or nothing done, 2 error (nothing changed)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.cli import main
from belayq.discovery import find
from belayq.embedded import free_port
from belayq.keys import rq_layout
from belayq.registry import Registry
from tests.core.conftest import run

COMMANDS = ("queues", "stats", "inspect", "delayed", "dead", "history", "replay", "purge",
            "drop", "pause", "resume", "watch", "exporter", "dashboard", "demo", "upgrade")

#: Words the help never uses (it speaks of the product and its users only).
NOT_SAID = re.compile(r"\b(seeds?|issues?|stop|stops|stopped|sessions?)\b", re.I)


def helped(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as ended:
        main([*argv, "--help"])
    out, err = capsys.readouterr()
    assert ended.value.code == 0 and not err
    return out


def subparsers() -> dict[str, argparse.ArgumentParser]:
    from belayq.cli.parser import build

    [action] = [a for a in build()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_main_help_sums_up_every_command_in_a_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = helped(capsys)
    for name in COMMANDS:
        line = re.search(rf"^ {{4}}{name} +(\S.{{15,}})$", text, re.M)
        assert line is not None, f"{name} has no summary in belayq --help:\n{text}"
    assert set(subparsers()) == set(COMMANDS)
    assert "exit status" in text and "belayq queues --url" in text
    assert not NOT_SAID.search(text)


def test_each_command_says_what_it_does_its_arguments_an_example_and_its_exit_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, parser in subparsers().items():
        text = helped(capsys, name)
        assert parser.description and len(parser.description) > 60, name
        assert f"belayq {name} " in text.split("example", 1)[1], f"{name}: no example"
        assert re.search(r"^exit status:\n  \d+ ", text, re.M), f"{name}: no exit status"
        assert not NOT_SAID.search(text), (name, NOT_SAID.search(text))
        for action in parser._actions:
            assert action.help, f"belayq {name} {action.option_strings or action.dest}: no help"


def test_no_command_prints_the_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 2 and not out and "queues" in err and "COMMAND" in err


def test_bad_numbers_are_refused_before_anything_runs(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (("inspect", "q", "--limit", "0"), ("dead", "q", "--limit", "-3"),
                 ("watch", "--interval", "-1"), ("watch", "--count", "x"),
                 ("exporter", "--port", "70000")):
        with pytest.raises(SystemExit) as ended:
            main([argv[0], "--url", url, *argv[1:]])
        _, err = capsys.readouterr()
        assert ended.value.code == 2 and "error: argument" in err and "Traceback" not in err


def test_history_says_when_it_is_off_and_what_it_keeps(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ReliableQueue(client, "plain", keeper=False).publish(b"x")
    code, out, err = run(capsys, "history", "--url", url, "plain")
    assert code == 0 and "history is off for plain (history_max 0)" in out, (out, err)
    code, out, err = run(capsys, "history", "--url", url, "plain", "--json")
    assert code == 0 and not out and "history is off" in err  # stdout stays JSON
    kept = ReliableQueue(client, "kept", keeper=False, history_max=7, history_ttl_ms=3_600_000)
    code, out, _ = run(capsys, "history", "--url", url, "kept")
    assert code == 0 and "keeps the last 7 of each outcome for 1 h" in out
    kept.publish(b"y")
    [d] = kept.claim(timeout=0)
    kept.ack(d, result="fine")
    code, out, _ = run(capsys, "history", "--url", url, "kept")
    assert code == 0 and "fine" in out and "finished" in out.splitlines()[0]
    assert "history is off" not in out and "keeps the last" not in out


def test_recorded_history_and_events_are_not_taken_by_other_processes(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ReliableQueue(client, "noted", keeper=False, history_max=5, events=True)
    other = ReliableQueue(client, "noted", keeper=False)  # names neither: keeps neither
    assert other.config.history_max == 0 and other.config.events is False
    rec = Registry(client).get("belayq", "noted")
    assert rec is not None and (rec.history_max, rec.events) == (5, True)
    code, out, _ = run(capsys, "stats", "--url", url, "noted")
    lines = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert code == 0 and lines["events"] == "on" and lines["history"].startswith("the last 5")
    assert "leased" not in lines and lines["lease_ms"] == "30000"
    code, out, _ = run(capsys, "stats", "--url", url, "noted", "--json")
    assert json.loads(out)["settings"]["history_max"] == 5


def test_a_queue_no_belayq_process_opened_says_its_settings_are_not_recorded(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client.sadd("rq:queues", "rq:queue:reports")
    client.rpush("rq:queue:reports", "job-1")
    assert not find(client, "reports").recorded
    code, out, _ = run(capsys, "stats", "--url", url, "reports")
    assert code == 0 and "not recorded" in out and "no belayq process has opened it" in out
    code, out, _ = run(capsys, "stats", "--url", url, "reports", "--json")
    assert json.loads(out)["settings"] is None


def test_dead_says_when_failures_are_recorded_by_the_framework(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ReliableQueue(client, "jobs", keeper=False, exhausted="deliver", **rq_layout("jobs"))  # type: ignore[arg-type]
    code, out, _ = run(capsys, "dead", "--url", url, "jobs")
    assert code == 0 and "no dead letters in jobs" in out and "exhausted=deliver" in out
    assert "FailedJobRegistry" in out
    code, out, _ = run(capsys, "history", "--url", url, "jobs", "--failed")
    assert code == 0 and "exhausted=deliver" in out


def test_empty_listings_say_so_and_exit_0(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "queues", "--url", url)
    assert code == 0 and "no queues known on" in out
    ReliableQueue(client, "idle", keeper=False)
    for command, said in (("inspect", "no message of idle is claimed now"),
                          ("delayed", "no delayed message in idle"),
                          ("dead", "no dead letters in idle")):
        code, out, _ = run(capsys, command, "--url", url, "idle")
        assert code == 0 and said in out, (command, out)


def test_replay_exits_1_for_ids_that_are_not_dead_letters_and_replays_the_others(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish_many([b"1", b"2"])
    held = q.claim(timeout=0, count=2)
    for d in held:
        q.dead_letter(d, "boom")
    code, out, err = run(capsys, "replay", "--url", url, "jobs", "--id", held[0].id,
                         "--id", "no-such-id")
    assert code == 1 and "replayed 1" in out and "no-such-id" in err
    assert q.stats()["dead"] == 1 and q.stats()["ready"] == 1
    code, out, err = run(capsys, "replay", "--url", url, "jobs", "--id", "gone", "--json")
    assert code == 1 and json.loads(out) == {"queue": "jobs", "kind": "belayq", "replayed": 0,
                                            "not_dead": ["gone"]}
    code, _, err = run(capsys, "replay", "--url", url, "jobs", "--reason", "timeout")
    assert code == 1 and "no dead letter of jobs" in err and q.stats()["dead"] == 1
    code, out, _ = run(capsys, "replay", "--url", url, "jobs", "--all")
    assert code == 0 and "replayed 1" in out and q.stats()["dead"] == 0
    code, out, _ = run(capsys, "replay", "--url", url, "jobs", "--all")
    assert code == 0 and "nothing to replay" in out


def test_purge_of_an_empty_queue_is_done_without_asking_and_drop_asks(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    ReliableQueue(client, "empty", keeper=False)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    code, out, err = run(capsys, "purge", "--url", url, "empty")
    assert code == 0 and "0 ready" in out, err
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)

    def ended(prompt: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", ended)  # Ctrl-D at the question
    code, _, err = run(capsys, "drop", "--url", url, "empty")
    assert code == 1 and "nothing deleted" in err and find(client, "empty")
    code, out, _ = run(capsys, "drop", "--url", url, "empty", "--yes", "--json")
    assert code == 0 and json.loads(out)["dropped"] is True


def test_serving_on_a_port_taken_is_one_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        for command in ("exporter", "dashboard"):
            code, out, err = run(capsys, command, "--url", url, "--port", port)
            assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err, (command, err)
            assert len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "dashboard", "--url", url, "--host", "0.0.0.0")
    assert code == 2 and "token" in err and len(err.strip().splitlines()) == 1


def test_upgrade_of_an_unknown_queue_says_so(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "upgrade", "--url", url, "never-made")
    assert code == 2 and "no queue 'never-made'" in err and "schema none" not in err


def test_the_help_names_every_framework_and_every_kind_of_queue(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from belayq.discovery import KNOWN_KINDS

    main_help = " ".join(helped(capsys).split())
    for framework in ("Celery", "RQ", "Dramatiq"):
        assert framework in main_help, framework
    for command in ("queues", "stats"):
        kind_help = " ".join(helped(capsys, command).split())
        for kind, owner in zip(KNOWN_KINDS, ("belayq's own", "Celery's", "RQ's",
                                             "Dramatiq's"), strict=True):
            assert f"{kind} ({owner})" in kind_help, (command, kind)
