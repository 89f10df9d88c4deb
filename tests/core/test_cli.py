"""The ``belayq`` command on a real server: it finds belayq's own queues and the lists
``belayq://`` (Celery) and ``belayq_rq`` adopt, shows what is in flight, delayed, dead and
finished, replays, purges and drops (with a confirmation), watches, and exports Prometheus
metrics. Errors are one line and exit status 2; a password is never printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.embedded import free_port
from belayq.keys import kombu_layout, rq_layout
from tests.core.conftest import run, scrape_once

ROOT = Path(__file__).resolve().parents[2]




def rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def three_queues(client: redis.Redis) -> tuple[ReliableQueue, ReliableQueue, ReliableQueue]:
    own = ReliableQueue(client, "emails", keeper=False, lease_ms=60_000)
    kombu = ReliableQueue(client, "celery", keeper=False, **kombu_layout("celery"))
    rq = ReliableQueue(client, "default", keeper=False, **rq_layout("default"))
    own.publish_many([b"a", b"b"])
    kombu.publish(json.dumps({"headers": {"task": "proj.add", "id": "t-1"},
                              "body": "e30="}).encode())
    rq.publish(b"job-1")
    return own, kombu, rq


def test_queues_finds_all_three_kinds(client: redis.Redis, url: str, capsys: Any) -> None:
    three_queues(client)
    code, out, _ = run(capsys, "queues", "--url", url, "--json")
    got = {(r["kind"], r["queue"]): r["ready"] for r in rows(out)}
    assert code == 0 and got == {("belayq", "emails"): 2, ("kombu", "celery"): 1,
                                 ("rq", "default"): 1}
    code, out, _ = run(capsys, "queues", "--url", url)
    assert code == 0 and "emails" in out and "celery" in out and "ready" in out.splitlines()[0]


def test_inspect_delayed_dead_and_history(client: redis.Redis, url: str, capsys: Any) -> None:
    own, kombu, _ = three_queues(client)
    [d] = kombu.claim(timeout=0)
    code, out, _ = run(capsys, "inspect", "--url", url, "celery", "--json")
    [held] = rows(out)
    assert code == 0 and held["task"] == "proj.add" and held["task_id"] == "t-1"
    assert 0 < held["lease_left_s"] <= kombu.config.lease_ms / 1000 and held["deliveries"] == 1
    own.publish(b"later", delay_ms=60_000)
    code, out, _ = run(capsys, "delayed", "--url", url, "emails", "--json")
    [waiting] = rows(out)
    assert 55 < waiting["due_in_s"] <= 60 and waiting["payload"] == "later"
    kombu.dead_letter(d, "bad task")
    code, out, _ = run(capsys, "dead", "--url", url, "celery", "--json")
    [dead] = rows(out)
    assert dead["reason"] == "bad task" and dead["task"] == "proj.add"
    logged = ReliableQueue(client, "logged", keeper=False, history_max=5)
    logged.publish(b"x")
    [d] = logged.claim(timeout=0)
    logged.ack(d, result="42")
    code, out, _ = run(capsys, "history", "--url", url, "logged", "--json")
    assert [(r["result"], r["payload"]) for r in rows(out)] == [("42", "x")]
    code, out, _ = run(capsys, "stats", "--url", url, "celery", "--json")
    stats = json.loads(out)
    assert stats["kind"] == "kombu" and stats["dead"] == 1
    assert stats["ready_by_priority"] == {"0": 0, "3": 0, "6": 0, "9": 0}


def test_replay_by_id_by_reason_and_all(client: redis.Redis, url: str, capsys: Any) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish_many([b"1", b"2", b"3"])
    held = q.claim(timeout=0, count=3)
    for d, why in zip(held, ("timeout", "bad input", "timeout again"), strict=True):
        q.dead_letter(d, why)
    code, out, _ = run(capsys, "replay", "--url", url, "jobs", "--id", held[1].id)
    assert code == 0 and "replayed 1" in out
    code, out, _ = run(capsys, "replay", "--url", url, "jobs", "--reason", "timeout")
    assert "replayed 2" in out and q.stats()["ready"] == 3
    for d, why in zip(q.claim(timeout=0, count=3), "xyz", strict=True):
        q.dead_letter(d, why)
    code, out, _ = run(capsys, "replay", "--url", url, "jobs", "--all")
    assert "replayed 3" in out and q.stats()["dead"] == 0


def test_purge_and_drop_ask_first(client: redis.Redis, url: str, capsys: Any,
                                  monkeypatch: Any) -> None:
    q = ReliableQueue(client, "doomed", keeper=False)
    q.publish_many([b"x"] * 2500)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    code, _, err = run(capsys, "purge", "--url", url, "doomed")
    assert code == 2 and "--yes" in err and q.stats()["ready"] == 2500
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "not-the-name")
    code, _, err = run(capsys, "purge", "--url", url, "doomed")
    assert code == 1 and q.stats()["ready"] == 2500
    monkeypatch.setattr("builtins.input", lambda prompt: "doomed")
    code, out, err = run(capsys, "purge", "--url", url, "doomed")
    assert code == 0 and "2500 ready" in out and "purged..." in err  # progress per batch
    q.publish(b"y")
    [d] = q.claim(timeout=0)
    code, _, err = run(capsys, "drop", "--url", url, "doomed", "--yes")
    assert code == 2 and "claimed" in err and client.exists(q.keys.stats)
    q.ack(d)
    code, out, _ = run(capsys, "drop", "--url", url, "doomed", "--yes")
    assert code == 0 and not client.exists(q.keys.stats)


def test_errors_are_one_line_with_status_2_and_no_password(capsys: Any, url: str) -> None:
    code, _, err = run(capsys, "stats", "--url", url, "no-such-queue")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no queue" in err
    code, _, err = run(capsys, "stats", "--url", "http://example.com", "q")
    assert code == 2 and "not a Redis URL" in err
    secret = "s3cret-pw-xyz"
    code, _, err = run(capsys, "queues", "--url", f"redis://u:{secret}@127.0.0.1:{free_port()}/0")
    assert code == 2 and secret not in err and "***" in err and len(err.strip().splitlines()) == 1


def test_watch_shows_the_queues(client: redis.Redis, url: str, capsys: Any) -> None:
    three_queues(client)
    code, out, _ = run(capsys, "watch", "--url", url, "--interval", "0.05", "--count", "2")
    assert code == 0 and out.count("emails") == 2


def test_the_exporter_serves_prometheus_metrics(client: redis.Redis, url: str) -> None:
    own, _, _ = three_queues(client)
    [d] = own.claim(timeout=0)
    own.ack(d)
    own.claim(timeout=0)
    own.publish(b"waits")
    metrics = scrape_once(url)
    assert metrics['belayq_acked_total{kind="belayq",queue="emails"}'] == 1
    assert metrics['belayq_published_total{kind="kombu",queue="celery"}'] == 1
    assert metrics['belayq_in_flight{kind="belayq",queue="emails"}'] == 1
    assert metrics['belayq_ready{kind="belayq",priority="0",queue="emails"}'] == 1
    assert 0 <= metrics['belayq_oldest_ready_age_seconds{kind="belayq",queue="emails"}'] < 60
    assert metrics['belayq_ready{kind="rq",priority="0",queue="default"}'] == 1
    assert 0 <= metrics['belayq_oldest_lease_age_seconds{kind="belayq",queue="emails"}'] < 5
    # A stock producer's entries carry no time.
    assert 'belayq_oldest_ready_age_seconds{kind="kombu",queue="celery"}' not in metrics


def test_the_entry_point_is_installed() -> None:
    entry = Path(sys.executable).with_name("belayq")
    out = subprocess.run([str(entry), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "belayq queues" in out.stdout
