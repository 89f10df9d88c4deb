"""``belayq pause`` / ``belayq resume``: they find the queue as the other commands do
(``--kind``, refusing a name that is no queue), say what changed, show in ``stats``, the
control history and ``inspect``'s ``held_by``."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.keys import rq_layout
from tests.core.conftest import run


def test_pause_and_resume_a_queue(client: redis.Redis, url: str, capsys: Any) -> None:
    q = ReliableQueue(client, "emails", keeper=False, history_max=10)
    q.publish(b"a")
    code, out, _ = run(capsys, "pause", "--url", url, "emails")
    assert code == 0 and "paused emails" in out
    assert q.claim(timeout=0) == []
    code, out, _ = run(capsys, "pause", "--url", url, "emails", "--json")
    assert code == 0 and json.loads(out) == {"queue": "emails", "kind": "belayq",
                                             "paused": True, "changed": False}
    code, out, _ = run(capsys, "stats", "--url", url, "emails", "--json")
    assert json.loads(out)["paused"] == 1
    code, out, _ = run(capsys, "resume", "--url", url, "emails")
    assert code == 0 and "resumed emails" in out
    code, out, _ = run(capsys, "resume", "--url", url, "emails")
    assert code == 0 and "was not paused" in out
    assert [d.payload for d in q.claim(timeout=0)] == [b"a"]
    code, out, _ = run(capsys, "history", "--url", url, "emails", "--control", "--json")
    got = [json.loads(line) for line in out.splitlines()]
    assert [r["action"] for r in got] == ["resumed", "paused"]
    assert all(r["by"].endswith(f"{socket.gethostname()}:{os.getpid()} (cli)") for r in got)


def test_pause_with_kind_and_a_name_that_is_no_queue(client: redis.Redis, url: str,
                                                     capsys: Any) -> None:
    rq = ReliableQueue(client, "default", keeper=False, **rq_layout("default"))
    rq.publish(b"job-1")
    code, _, err = run(capsys, "pause", "--url", url, "default", "--kind", "kombu")
    assert code == 2 and "no queue" in err
    code, _, _ = run(capsys, "pause", "--url", url, "default", "--kind", "rq")
    assert code == 0 and rq.stats()["paused"] == 1
    client.set("plain-key", "v")
    before = sorted(client.keys("*"))
    code, _, err = run(capsys, "pause", "--url", url, "plain-key")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no queue" in err
    assert sorted(client.keys("*")) == before  # nothing written for a name that is no queue


def test_inspect_shows_who_holds_each_claim(client: redis.Redis, url: str,
                                            capsys: Any) -> None:
    q = ReliableQueue(client, "emails", keeper=False)
    q.publish(b"a")
    q.claim(timeout=0)
    code, out, _ = run(capsys, "inspect", "--url", url, "emails", "--json")
    [row] = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and row["held_by"] == f"{socket.gethostname()}:{os.getpid()}"
    code, out, _ = run(capsys, "inspect", "--url", url, "emails")
    assert "held_by" in out.splitlines()[0]
