"""``belayq`` on RQ queues does what RQ's own commands do: ``belayq delayed`` shows the jobs
RQ's scheduler holds back (``enqueue_in``, ``enqueue_at``) beside belayq's own delayed
messages."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from rq import Queue as StockQueue

from belayq.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_delayed_shows_the_jobs_rqs_scheduler_holds(
    conn: redis.Redis, rq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = StockQueue("reports", connection=conn)
    later = q.enqueue_in(timedelta(minutes=5), "tests.plugins.rq.jobs.add", 1, 2)
    sooner = q.enqueue_in(timedelta(minutes=1), "tests.plugins.rq.jobs.add", 3, 4)
    q.enqueue("tests.plugins.rq.jobs.add", 5, 6)
    code, out, err = run(capsys, "delayed", "--url", rq_url, "reports", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0, err
    assert [r["id"] for r in rows] == [sooner.id, later.id]
    assert 50 < rows[0]["due_in_s"] <= 60 and 290 < rows[1]["due_in_s"] <= 300
    assert rows[0]["task"] == "tests.plugins.rq.jobs.add" and rows[0]["held_by"] == "rq scheduler"
