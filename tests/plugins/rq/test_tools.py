"""The tools RQ users already run, against a real ``belayq_rq`` worker: rq-dashboard (its
queues, registries and workers, over its JSON API, as its page shows them) and ``rq info``.
(``rq worker-pool -w belayq_rq.Worker`` is in test_crash.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
import redis
import rq

import belayq_rq
from belayq.embedded import free_port
from tests.plugins.rq import jobs
from tests.plugins.rq.conftest import ROOT, RQ_BIN, Workers, child_env
from tests.support import wait_for

pytest.importorskip("rq_dashboard")
FAST = "tests.plugins.rq.jobs.FastWorker"


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_rq_dashboard_and_rq_info(conn: redis.Redis, rq_url: str, workers: Workers,
                                  tmp_path: Any) -> None:
    q = belayq_rq.Queue("q1", connection=conn)
    failing = q.enqueue(jobs.fail)
    w = workers.start("q1", worker_class=FAST)
    wait_for(lambda: failing.get_status(refresh=True) == "failed", 30, workers.logs)
    running = q.enqueue(jobs.sleeper, 60)
    wait_for(lambda: running.get_status(refresh=True) == "started", 30, workers.logs)
    waiting = [q.enqueue(jobs.add, i, i) for i in range(3)]
    assert q.belayq().stats()["ready"] == 3

    port = free_port()
    board = subprocess.Popen(
        [str(RQ_BIN.with_name("rq-dashboard")), "-u", rq_url, "-b", "127.0.0.1", "-p",
         str(port)], env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "dashboard.log").open("w"), start_new_session=True)
    base = f"http://127.0.0.1:{port}/0/data"
    try:
        queues = wait_for(lambda: _try(f"{base}/queues.json"), 30,
                          lambda: (tmp_path / "dashboard.log").read_text()[-2000:])
        [q1] = [x for x in queues["queues"] if x["name"] == "q1"]
        assert q1["count"] == 3
        assert q1["started_job_registry_count"] == 1 and q1["failed_job_registry_count"] == 1
        listed = get(f"{base}/jobs/q1/queued/8/asc/1.json")["jobs"]
        assert [j["id"] for j in listed] == [j.id for j in waiting]
        [worker] = get(f"{base}/workers.json")["workers"]
        assert worker["queues"] == ["q1"] and worker["state"] == "busy"
        assert worker["current_job"]["job_id"] == running.id
        assert worker["failed_job_count"] == 1
        info = subprocess.run([str(RQ_BIN), "info", "-u", rq_url], env=child_env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert info.returncode == 0, info.stderr
        assert "3, 1 executing, 0 finished, 1 failed" in info.stdout, info.stdout
        assert "1 queues, 3 jobs total" in info.stdout and "busy q1" in info.stdout
    finally:
        board.kill()
        board.wait()
    assert w.poll() is None
    assert rq.Queue("q1", connection=conn).count == 3  # stock RQ reads the same list

    # kill -9 of the worker and its work horse: `belayq inspect` shows the running job's
    # claim, its lease running out (nobody extends it).
    workers.stop_all()
    first = inspect(rq_url)
    time.sleep(0.3)
    second = inspect(rq_url)
    assert [r["payload"] for r in first] == [running.id] == [r["payload"] for r in second]
    lease_s = jobs.SHORT_LEASE_MS / 1000  # below 0: expired, until a live worker sweeps
    assert second[0]["lease_left_s"] < first[0]["lease_left_s"] <= lease_s


def inspect(url: str) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "belayq", "inspect", "--url", url, "q1",
                          "--kind", "rq", "--json"],
                         capture_output=True, text=True, timeout=60, env=child_env())
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def _try(url: str) -> Any:
    try:
        return get(url)
    except OSError:
        return None
