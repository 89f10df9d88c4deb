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


def test_purge_does_what_rq_empty_does(
    conn: redis.Redis, rq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from belayq_rq import Queue

    q = Queue("bulk", connection=conn)
    jobs = [q.enqueue("tests.plugins.rq.jobs.add", i, i) for i in range(1500)]
    later = q.enqueue_in(timedelta(minutes=5), "tests.plugins.rq.jobs.add", 0, 0)
    held = q.belayq().claim(timeout=0)  # a job a worker holds: not waiting, not purged
    assert [d.payload.decode() for d in held] == [jobs[0].id]
    code, out, err = run(capsys, "purge", "--url", rq_url, "bulk", "--yes", "--json")
    assert code == 0, err
    counts = json.loads(out)
    assert counts["ready"] == 1499 and counts["job_keys_deleted"] == 1499
    assert conn.llen("rq:queue:bulk") == 0
    assert not any(conn.exists(f"rq:job:{j.id}") for j in jobs[1:])
    assert conn.exists(f"rq:job:{jobs[0].id}") and conn.exists(f"rq:job:{later.id}")
    code, out, err = run(capsys, "purge", "--url", rq_url, "bulk", "--yes", "--delayed",
                         "--json")
    assert code == 0 and json.loads(out)["scheduled"] == 1 and not conn.exists(
        f"rq:job:{later.id}")


def test_the_dashboard_purges_as_belayq_purge_does(conn: redis.Redis) -> None:
    """The dashboard's purge of an RQ queue deletes the queued jobs' hashes (and the
    scheduled jobs) as ``belayq purge --delayed`` and ``rq empty`` do: no job is left
    behind with status "queued" and no TTL."""
    pytest.importorskip("uvicorn")
    from belayq.web import create_app
    from belayq_rq import Queue
    from tests.web.conftest import _served
    from tests.web.test_dashboard import call

    q = Queue("bulk", connection=conn)
    jobs = [q.enqueue("tests.plugins.rq.jobs.add", i, i) for i in range(5)]
    later = q.enqueue_in(timedelta(minutes=5), "tests.plugins.rq.jobs.add", 0, 0)
    with _served(create_app(conn)) as base:
        status, answer = call(f"{base}/api/queue/rq/bulk/purge", {"confirm": "bulk"})
    assert status == 200, answer
    assert answer["purged"] == 6 and answer["ready"] == 5 and answer["scheduled"] == 1
    assert answer["job_keys_deleted"] == 5
    assert conn.llen("rq:queue:bulk") == 0
    assert not [j.id for j in [*jobs, later] if conn.exists(f"rq:job:{j.id}")]
