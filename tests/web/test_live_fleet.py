"""A live fleet on one Redis: a real ``celery worker`` (``belayq://``), ``rq worker --burst``
with belayq_rq's classes and a ``dramatiq`` worker run successes, failures, retries,
countdown and scheduled jobs, and dead letters. Then every number ``belayq queues``, the
dashboard's API and the exporter show equals the others' and the framework's own:
``rq info`` and RQ's registries, ``celery inspect`` and the result backend, Dramatiq's
keys (docs/operations.md maps them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Retry
from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

import belayq_rq
from belayq import readmodel
from belayq.discovery import list_queues, open_found
from belayq.embedded import RedisServer
from tests.plugins.rq import jobs
from tests.support import wait_for

from .test_read_model import SHARED, surfaces

web = pytest.importorskip("belayq.web")

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class Fleet:
    """The workers' subprocesses, stopped (their process groups killed) at the end."""

    def __init__(self, port: int, tmp: Path) -> None:
        self.env = {**os.environ, "FLEET_PORT": str(port),
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.tmp = tmp
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, *cmd: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, env=self.env, cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                         for _, log in self.procs)

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def fleet(private_redis: RedisServer, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(private_redis.port, tmp_path)
    try:
        yield f
    finally:
        f.stop()


def test_every_surface_shows_the_frameworks_numbers(
        client: redis.Redis, served: Any, fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    port = int(client.connection_pool.connection_kwargs["port"])
    monkeypatch.setenv("FLEET_PORT", str(port))
    from tests.web import fleet_celery, fleet_dramatiq

    # -- RQ: 3 successes, 2 failures (one retried once first), 2 scheduled, 1 dead letter
    rq_q = belayq_rq.Queue("fleet_r", connection=client)
    for i in range(3):
        rq_q.enqueue(jobs.add, i, 1)
    rq_q.enqueue(jobs.fail)
    rq_q.enqueue(jobs.fail, retry=Retry(max=1))
    rq_q.enqueue_in(timedelta(minutes=10), jobs.add, 1, 1)
    rq_q.enqueue_in(timedelta(minutes=20), jobs.add, 2, 2)
    client.rpush("rq:queue:fleet_r", "no-such-job")  # no job hash: dead-lettered
    rq = fleet.start("rq", str(BIN / "rq"), "worker", "--burst", "-u",
                     f"redis://127.0.0.1:{port}/0", "-w", "belayq_rq.Worker",
                     "-q", "fleet_r")

    # -- Celery: 2 successes, 2 failures, 1 retried then done, 1 rejected, 2 countdowns
    celery = fleet.start("celery", sys.executable, "-m", "celery", "-A",
                         "tests.web.fleet_celery", "worker", "--pool", "threads", "-c", "2",
                         "-n", f"fleet-{port}@%h", "-l", "info")
    sent = [fleet_celery.ok.delay(1), fleet_celery.ok.delay(2), fleet_celery.boom.delay(1),
            fleet_celery.boom.delay(2), fleet_celery.flaky.delay(1)]
    fleet_celery.rejected.delay(1)  # Celery stores no result of a rejected task
    for i in range(3):  # a queue no worker consumes
        fleet_celery.ok.apply_async((i,), queue=fleet_celery.IDLE)
    fleet_celery.ok.apply_async((3,), countdown=600)
    fleet_celery.ok.apply_async((4,), countdown=900)

    # -- Dramatiq: 2 successes, 1 failed once then done, 1 out of retries, 1 delayed
    dramatiq_w = fleet.start("dramatiq", sys.executable, "-m", "dramatiq",
                             "tests.web.fleet_dramatiq", "--processes", "1", "--threads", "2")
    fleet_dramatiq.ok.send(1)
    fleet_dramatiq.ok.send(2)
    fleet_dramatiq.once_flaky.send(1)
    fleet_dramatiq.always_fails.send(1)
    fleet_dramatiq.ok.send_with_options(args=(3,), delay=600_000)

    assert rq.wait(60) == 0, fleet.logs()
    waiting = [rq_q.enqueue(jobs.add, 9, 9) for _ in range(2)]  # after the burst: they wait
    wait_for(lambda: all(r.ready() for r in sent) and read_numbers("kombu", "fleet_c")["dead"] == 1,
             60, fleet.logs)
    d_core = fleet_dramatiq.broker.store(fleet_dramatiq.QUEUE).core
    wait_for(lambda: d_core.stats()["dead"] == 1 and d_core.stats()["ready"] == 0
             and d_core.stats()["in_flight"] == 0 and client.llen(fleet_dramatiq.RAISED) == 3,
             60, lambda: f"{d_core.stats()} {client.llen(fleet_dramatiq.RAISED)}")
    running = fleet_celery.long.delay(60)  # one task running while the numbers are read
    wait_for(lambda: running.state == "STARTED" or _active(fleet_celery.app) == 1, 30,
             fleet.logs)
    assert celery.poll() is None and dramatiq_w.poll() is None, fleet.logs()

    with served(web.create_app(client)) as base:
        rq_seen = surfaces(client, base, "rq", "fleet_r")
        c_seen = surfaces(client, base, "kombu", fleet_celery.QUEUE)
        idle_seen = surfaces(client, base, "kombu", fleet_celery.IDLE)
        d_seen = surfaces(client, base, "dramatiq", fleet_dramatiq.QUEUE)
    for seen in (rq_seen, c_seen, idle_seen, d_seen):
        first = seen["cli"]
        for surface, numbers in seen.items():
            for name in SHARED:
                assert numbers[name] == first[name], (surface, name, seen)

    # RQ: `rq info` and RQ's registries.
    rq_info = subprocess.run([str(BIN / "rq"), "info", "-u", f"redis://127.0.0.1:{port}/0",
                              "--only-queues", "--raw", "fleet_r"],
                             capture_output=True, text=True, check=True).stdout
    assert f"queue fleet_r {rq_seen['cli']['ready']}" in rq_info, rq_info
    rq_numbers = rq_seen["cli"]
    assert rq_numbers["ready"] == rq_q.count == len(waiting)
    assert rq_numbers["delayed"] == len(ScheduledJobRegistry(queue=rq_q)) == 2
    assert rq_numbers["failed"] == len(FailedJobRegistry(queue=rq_q)) == 2
    assert rq_numbers["in_flight"] == len(StartedJobRegistry(queue=rq_q)) == 0
    assert rq_numbers["dead"] == 1  # the id with no job: RQ itself keeps no dead letters
    assert rq_numbers["failed_runs"] == 3  # the retried job failed twice
    assert rq_numbers["acked"] == 6 and rq_numbers["out"] == 7  # 6 runs ended, 1 dead

    # Celery: `celery inspect` and the result backend.
    c_numbers = c_seen["cli"]
    inspect = fleet_celery.app.control.inspect(timeout=5, limit=1)  # one worker answers
    active = sum(len(v) for v in (inspect.active() or {}).values())
    reserved = sum(len(v) for v in (inspect.reserved() or {}).values())
    assert c_numbers["in_flight"] == active + reserved == 1
    with fleet_celery.app.connection() as conn:  # kombu's queue length (Flower's too)
        length = conn.default_channel._size(fleet_celery.QUEUE)
        idle = conn.default_channel._size(fleet_celery.IDLE)
    assert c_numbers["ready"] == length == 0
    assert idle_seen["cli"]["ready"] == idle == 3
    assert c_numbers["failed"] == sum(r.state == "FAILURE" for r in sent) == 2
    scheduled = sum(len(v) for v in (inspect.scheduled() or {}).values())
    assert c_numbers["delayed"] == scheduled == 2  # the countdowns, waiting in Redis
    assert c_numbers["dead"] == 1  # the rejected task
    assert c_numbers["running_for_s"] is not None and c_numbers["running_for_s"] >= 0

    # Dramatiq: its keys (the list, the .msgs hash) and the runs its actors saw raise.
    d_numbers = d_seen["cli"]
    d_list = f"dramatiq:{fleet_dramatiq.QUEUE}"
    assert d_numbers["ready"] == client.llen(d_list) == 0
    assert d_numbers["delayed"] == 1 and d_numbers["dead"] == 1
    assert client.hlen(f"{d_list}.msgs") == (d_numbers["ready"] + d_numbers["in_flight"]
                                             + d_numbers["delayed"] + d_numbers["dead"])
    runs = client.lrange(fleet_dramatiq.RAISED, 0, -1)
    # A record per message that raised, but one out of retries counts as its dead letter.
    assert d_numbers["failed"] == len(set(runs)) - d_numbers["dead"] == 1
    assert d_numbers["failed_runs"] == len(runs) == 3  # every run that raised


def read_numbers(kind: str, name: str) -> dict[str, Any]:
    client = redis.Redis(port=int(os.environ["FLEET_PORT"]))
    [found] = [f for f in list_queues(client, kind=kind) if f.name == name]
    return readmodel.read(open_found(client, found))


def _active(app: Any) -> int:
    active = app.control.inspect(timeout=1, limit=1).active() or {}
    return sum(len(v) for v in active.values())
