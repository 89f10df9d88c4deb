"""Passwords never show: a celery worker's banner and logs (Redis up, then down), the
``repr`` of kombu's and belayq's objects, belayq's errors, the ``python -m belayq_kombu``
CLI, an rq worker's log and ``repr`` of belayq_rq's objects."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import kombu
import pytest
import redis

import belayq_kombu  # noqa: F401
import belayq_rq
from belayq import ReliableQueue
from belayq.embedded import free_port
from tests.badinput.helpers import ROOT, CeleryWorker, child_env, start_server
from tests.plugins.rq.conftest import Workers
from tests.support import wait_for

SECRET = "SECRETPW"


def test_a_celery_worker_never_prints_the_password(tmp_path: Path) -> None:
    server = start_server()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "user", "on", f">{SECRET}", "~*", "&*", "+@all")
    url = f"belayq://user:{SECRET}@127.0.0.1:{server.port}/0"
    env = {"BQ_BROKER": url, "BQ_BACKEND": f"redis://user:{SECRET}@127.0.0.1:{server.port}/1",
           "BQ_QUEUE": "redact"}
    w = CeleryWorker(tmp_path / "worker.log", "--pool=solo", **env).wait_ready()
    try:
        assert "belayq://user:**@127.0.0.1" in w.text()  # the banner, masked
        server.stop()  # connection-error logs while Redis is down
        wait_for(lambda: "Cannot connect to belayq://user:**@" in w.text(), 60,
                 "the worker's connection-error log")
    finally:
        w.stop()
        server.stop()
    assert SECRET not in w.text(), [x for x in w.text().splitlines() if SECRET in x][:5]


def test_reprs_and_errors_never_show_the_password() -> None:
    port = free_port()  # nothing listens: every call fails to connect
    url = f"belayq://user:{SECRET}@127.0.0.1:{port}/0"
    conn = kombu.Connection(url, connect_timeout=0.5, transport_options={"max_retries": 0})
    texts = [repr(conn), str(conn), conn.as_uri()]
    with pytest.raises(Exception) as caught:
        conn.ensure_connection(max_retries=1)
    texts += [repr(caught.value), str(caught.value)]
    transport = conn.transport
    texts += [repr(transport), repr(conn)]
    # The redis-py client's own repr is redis-py's: 6.x prints the password in it (5.x,
    # 7.x and 8.x do not; README "Security"). belayq's texts around it must not.
    client = redis.Redis.from_url(f"redis://user:{SECRET}@127.0.0.1:{port}/0")
    with pytest.raises(Exception) as caught:
        ReliableQueue(client, "q")
    texts += [repr(caught.value), str(caught.value), repr(caught.value.__cause__)]
    with pytest.raises(ValueError) as bad:
        kombu.Connection(url, transport_options={"no_such_option": SECRET[:3]}).connect()
    texts.append(str(bad.value))
    queue = belayq_rq.Queue("q", connection=client)
    texts += [repr(queue), str(queue)]
    assert not [t for t in texts if SECRET in t], texts


def test_the_cli_never_prints_the_password() -> None:
    port = free_port()
    url = f"belayq://user:{SECRET}@127.0.0.1:{port}/0"
    for args in (["stats", "--url", url, "--queue", "q"],
                 ["stats", "--url", url, "--queue", "q", "-o", "no_such_option=1"]):
        out = subprocess.run([sys.executable, "-m", "belayq_kombu", *args], capture_output=True,
                             text=True, timeout=60, env=child_env(), cwd=ROOT)
        assert out.returncode != 0
        assert SECRET not in out.stdout + out.stderr, (out.stdout + out.stderr)[-2000:]


def test_an_rq_worker_never_prints_the_password(tmp_path: Path) -> None:
    server = start_server()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "user", "on", f">{SECRET}", "~*", "&*", "+@all")
    ws = Workers(f"redis://user:{SECRET}@127.0.0.1:{server.port}/0", tmp_path)
    try:
        proc = ws.start("redact", worker_class="belayq_rq.Worker")
        wait_for(lambda: "Listening on" in Path(proc.log).read_text(), 30, "the rq worker")
        server.stop()
        time.sleep(3)
    finally:
        ws.stop_all()
        server.stop()
    log = Path(proc.log).read_text(errors="replace")
    assert SECRET not in log, [x for x in log.splitlines() if SECRET in x][:5]
