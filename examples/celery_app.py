"""A Celery app on belayq://, and a walkthrough of what happens when its worker is killed.

As an app (the only change from a stock Redis setup is the import and the URL scheme)::

    BROKER_URL=belayq://localhost:6379/0 celery -A celery_app worker     # from examples/

As a walkthrough (exits 0 when every task completed; starts a throwaway redis-server on a
free port unless ``REDIS_URL`` is set)::

    uv run examples/celery_app.py

The walkthrough starts worker 1 (prefork, 2 processes), sends 6 tasks of 4 s each, and
``kill -9``s worker 1 with all its processes while two tasks run and two more wait in its
prefetch. With the stock transport those four would sit in the ``unacked`` hash for an hour
(the default ``visibility_timeout``), and with ``acks_late=False`` the two running ones
would be lost. Here worker 2 runs them about one lease (5 s in this demo) after the kill.

The settings that matter, all in ``app.conf`` below:

* ``task_acks_late=True``: a task's message is acked when the task is done, so a task
  running at a crash is run again (at least once);
* ``task_reject_on_worker_lost=True``: a pool child killed mid-task (OOM killer) puts its
  task back instead of failing it; after ``max_deliveries`` such deaths the message goes
  to the dead-letter list (``python -m belayq_kombu dead-letters ...``);
* ``visibility_timeout`` is belayq's lease: a live worker extends it for every message it
  holds, so long tasks and ETAs never run twice; a dead worker's messages come back within
  the lease plus ``sweep_interval``.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery

import belayq_kombu  # noqa: F401  (registers the belayq:// and belayqs:// schemes)

HERE = Path(__file__).resolve().parent
BROKER = os.environ.get("BROKER_URL", "belayq://localhost:6379/0")
BACKEND = os.environ.get("RESULT_BACKEND", BROKER.replace("belayq://", "redis://", 1))

app = Celery("celery_app", broker=BROKER, backend=BACKEND)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    broker_transport_options={
        "visibility_timeout": 5,  # the lease (s); the default is 20
        "sweep_interval": 0.5,  # how often the fleet looks for expired leases (s)
        "max_deliveries": 5,  # then the dead-letter list
    },
    worker_hijack_root_logger=False,
)


@app.task(bind=True)
def work(self: Any, i: int, seconds: float) -> str:
    """Pretend to work; note each start in a list the walkthrough reads."""
    log = redis.Redis.from_url(BACKEND)
    log.rpush("celery_app:starts", json.dumps({"i": i, "pid": os.getpid(), "t": time.time()}))
    time.sleep(seconds)
    return f"task {i} done by pid {os.getpid()}"


def _worker(env: dict[str, str], name: str, logfile: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=prefork", "-c",
         "2", "-n", f"{name}@%h", "-l", "info", "--without-mingle"],
        cwd=HERE, env=env, stdout=logfile.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAILED: timed out waiting for {what}")
        time.sleep(0.1)


def walkthrough() -> int:
    from belayq.embedded import RedisServer

    server = None
    url = os.environ.get("REDIS_URL")
    if not url:
        server = RedisServer().start()
        url = server.url
        print(f"embedded redis-server on port {server.port}")
    base = url.rsplit("/", 1)[0]
    env = dict(os.environ, BROKER_URL=base.replace("redis://", "belayq://", 1) + "/0",
               RESULT_BACKEND=base + "/1", PYTHONPATH=str(HERE))
    os.environ.update(env)
    app.conf.broker_url, app.conf.result_backend = env["BROKER_URL"], env["RESULT_BACKEND"]
    logs = Path(os.environ.get("CELERY_APP_LOGS", "/tmp"))
    workers: list[subprocess.Popen[bytes]] = []
    try:
        log = redis.Redis.from_url(env["RESULT_BACKEND"])
        log.delete("celery_app:starts")
        w1 = _worker(env, "worker1", logs / "celery_app_worker1.log")
        workers.append(w1)
        results = [work.delay(i, 4.0) for i in range(6)]
        print(f"sent 6 tasks of 4 s to {env['BROKER_URL']}; worker 1 (pid {w1.pid}) starts them")
        _wait(lambda: log.llen("celery_app:starts") >= 2, 60, "worker 1 to start two tasks")
        w2 = _worker(env, "worker2", logs / "celery_app_worker2.log")
        workers.append(w2)
        time.sleep(1.0)
        os.killpg(w1.pid, signal.SIGKILL)
        killed = time.time()
        w1.wait()
        with app.connection_for_read() as conn:
            stats = conn.default_channel.queue("celery").stats()
        print(f"kill -9 of worker 1 and its pool children: {stats['in_flight']} task(s) it held "
              f"(2 running, the rest prefetched) stay leased in Redis, {stats['ready']} ready")
        values = [r.get(timeout=120) for r in results]
        # Let the results go while the result store is up: each one unsubscribes from it when
        # collected, and after the server stops Celery would retry that for two minutes.
        del results
        gc.collect()
        starts = [json.loads(x) for x in log.lrange("celery_app:starts", 0, -1)]
        again = sorted(s["t"] - killed for s in starts if s["t"] > killed)
        reruns = len(starts) - 6
        print(f"worker 2 (pid {w2.pid}) picked up the dead worker's tasks "
              f"{again[0]:.1f} s after the kill (lease 5 s)")
        for v in values:
            print("  ", v)
        print(f"OK: all 6 tasks completed; {reruns} ran a second time because worker 1 died "
              "while running them (at-least-once), none was lost")
        return 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
                try:
                    w.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(w.pid, signal.SIGKILL)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(walkthrough())
