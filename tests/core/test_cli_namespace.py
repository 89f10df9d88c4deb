"""``--namespace`` on the command line: it narrows a listing as it narrows a named queue, and a
queue not found in a namespace says how to reach a Celery app with a ``global_keyprefix``
(such an app records its queues under that prefix, not in a namespace of the registry)."""

from __future__ import annotations

import json

import pytest
import redis

from belayq import ReliableQueue
from belayq.keys import dramatiq_layout


def url_of(r: redis.Redis) -> str:
    return f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}/0"


def test_a_queue_missing_from_a_namespace_says_how_to_reach_a_global_keyprefix_app(
    r: redis.Redis, qname: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from belayq.cli import main

    # What a Celery app with global_keyprefix "app2:" records: its registry and keys under
    # that prefix.
    ReliableQueue(r, qname, keeper=False, prefix="app2:belayq").publish(b"x")
    url = url_of(r)
    assert main(["stats", "--url", url, qname, "--namespace", "app2:"]) == 2
    err = capsys.readouterr().err
    assert "--prefix app2:belayq" in err and "global_keyprefix" in err
    assert main(["stats", "--url", url, qname, "--prefix", "app2:belayq", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ready"] == 1
    assert main(["stats", "--url", url, qname]) == 2  # no namespace asked: no such hint
    assert "--prefix" not in capsys.readouterr().err


def test_queues_lists_only_the_namespace_asked_for(
    r: redis.Redis, qname: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from belayq.cli import main

    ReliableQueue(r, qname, keeper=False, **dramatiq_layout(qname))
    ReliableQueue(r, qname, keeper=False, **dramatiq_layout(qname, namespace="app2"))
    url = url_of(r)
    assert main(["queues", "--url", url, "--kind", "dramatiq", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(row.get("namespace", "") for row in rows if row["queue"] == qname) == [
        "", "app2"]
    assert main(["queues", "--url", url, "--namespace", "app2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["queue"], row.get("namespace")) for row in rows] == [(qname, "app2")]
