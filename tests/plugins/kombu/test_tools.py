"""The tools Celery users already run, against a real worker on ``belayq://``: Flower
(with ``belayq_kombu.flower`` imported from its ``flowerconfig.py``: its queue lengths, its
workers and its tasks, as the user sees them over its HTTP API and Broker tab), and
``celery status``, ``celery inspect`` and ``celery purge``.

The queue lengths are exact: a task sent at a low priority while the first list is empty
rings the priority bell there, which Flower's stock Redis count would add as a task."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq.embedded import free_port
from tests.support import wait_for

from .conftest import CELERY, HERE

pytest.importorskip("flower")
BELL = b"\0belayq:bell"


def get(url: str) -> Any:
    req = urllib.request.Request(url)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"ops:pw").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read().decode()
    return json.loads(body) if body.startswith(("{", "[")) else body


def celery(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([*CELERY, "-A", "worker_app", *args], env=env, cwd=HERE,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_flower_and_the_celery_commands(workers: Any, celery_env: dict[str, str], kq: str,
                                        port: int, tmp_path: Path) -> None:
    from celery import Celery

    app = Celery("producer", broker=celery_env["BQ_BROKER"])
    w = workers("-P", "prefork", "-c", "1", "-E", BQ_PREFETCH="1").wait_ready()
    conf = tmp_path / "flowerconfig.py"
    conf.write_text("import belayq_kombu.flower  # noqa: F401\n")
    fport = free_port()
    flower = subprocess.Popen(
        [*CELERY, "-A", "worker_app", "flower", f"--port={fport}", "--address=127.0.0.1",
         f"--conf={conf}", "--basic-auth=ops:pw"], env=celery_env, cwd=HERE,
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "flower.log").open("w"),
        start_new_session=True)
    base = f"http://127.0.0.1:{fport}"
    try:
        wait_for(lambda: _up(base), 30, lambda: (tmp_path / "flower.log").read_text()[-2000:])
        time.sleep(2)  # Flower's event receiver connects: it shows the tasks from then on
        running = app.send_task("worker_app.sleeper", (0, 60), queue=kq)
        r = redis.Redis(port=port)
        wait_for(lambda: redis.Redis(port=port, db=1).llen(f"records:{kq}"), 20,
                 "the first task to start")
        for i in range(5):
            app.send_task("worker_app.add", (i, i), queue=kq, priority=5)
        wait_for(lambda: r.lpos(kq, BELL) is not None or r.llen(kq) == 0, 5, "the publishes")
        assert r.lpos(kq, BELL) is not None  # the bell rang: Flower's stock count would say 6
        lengths = wait_for(lambda: _queues(base), 30, "Flower's queue lengths")
        levels = [kq] + [f"{kq}\x06\x16{step}" for step in (3, 6, 9)]
        in_lists = sum(r.llen(level) for level in levels)
        assert lengths == [{"name": kq, "messages": in_lists - 1}]  # all five, not the bell
        assert in_lists - 1 >= 4  # five sent; the worker may have taken one (prefetch 1)
        workers_seen = wait_for(lambda: get(f"{base}/api/workers?refresh=1"), 30, "workers")
        assert any(name.startswith(w.name.split("@")[0]) for name in workers_seen)
        tasks = wait_for(lambda: get(f"{base}/api/tasks"), 30, "Flower's task list")
        assert running.id in tasks and tasks[running.id]["name"] == "worker_app.sleeper"
        page = get(f"{base}/broker")
        assert kq in page and "not supported" not in page
        # A countdown task waits in Redis, held by no worker: Flower's page of the worker
        # (which asks it alone, `inspect scheduled`) lists it among its scheduled tasks.
        later = app.send_task("worker_app.add", (7, 7), queue=kq, countdown=300)
        node = next(name for name in workers_seen if name.startswith(w.name.split("@")[0]))
        shown = wait_for(lambda: get(f"{base}/api/workers?workername={node}&refresh=1")
                         [node].get("scheduled"), 30, "Flower's scheduled tasks")
        assert [e["request"]["id"] for e in shown] == [later.id]
        assert later.id in get(f"{base}/worker/{node}")

        # What celery-exporter calls, through a stock redis:// connection to the same server
        # (it is not on PyPI, so it is not run; these are its reads).
        stock = Celery("exporter", broker=f"redis://127.0.0.1:{port}/0")
        control = stock.control.inspect(timeout=3)
        queues_of = control.active_queues() or {}
        assert [q["name"] for qs in queues_of.values() for q in qs] == [kq]
        assert next(iter((control.stats() or {}).values()))["pool"]["processes"]
        with stock.connection_for_read() as conn:
            assert conn.channel().client.llen(kq) == r.llen(kq)

        status = celery(celery_env, "status")
        assert w.name.split("@")[0] in status and "1 node online" in status
        active = celery(celery_env, "inspect", "active")
        assert running.id in active
        purged = celery(celery_env, "purge", "-f", "-Q", kq)
        assert "Purged" in purged and r.llen(kq) == 0
        assert get(f"{base}/api/queues/length")["active_queues"] == [{"name": kq, "messages": 0}]
    finally:
        flower.kill()
        flower.wait()
        w.kill9()  # not a warm shutdown: that would wait for the minute-long task

    # The killed worker's claims, as `belayq inspect` shows them: leases running out.
    first = inspect(port, kq)
    time.sleep(1.5)
    second = inspect(port, kq)
    assert running.id in {row["task_id"] for row in first}
    assert [row["id"] for row in second] == [row["id"] for row in first]
    for a, b in zip(first, second, strict=True):
        assert 0 < b["lease_left_s"] < a["lease_left_s"] <= 20  # BQ_LEASE: nobody extends it


def inspect(port: int, queue: str) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "belayq", "inspect", "--url",
                          f"redis://127.0.0.1:{port}/0", queue, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def _up(base: str) -> bool:
    try:
        get(f"{base}/healthcheck")
        return True
    except OSError:
        return False


def _queues(base: str) -> list[dict[str, Any]] | None:
    got = get(f"{base}/api/queues/length")["active_queues"]
    return got or None
