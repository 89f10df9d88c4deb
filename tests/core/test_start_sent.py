"""``start(now=True)`` and ``send_started``: a start report is written to its connection and
its answer read later. Once the call returns the report reaches Redis, even when the
process is killed the next instant; a report whose answer is lost is sent again with the
keeper's next extend and still counts once; a report that found the scripts gone runs
again when its answer is read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from belayq import ConnectionLost, ReliableQueue
from belayq.admin import parse_meta
from belayq.embedded import RedisServer
from tests.conftest import make_client
from tests.core.conftest import MODES
from tests.support import wait_for


@pytest.fixture(params=MODES, ids=["redis-functions", "redis-scripts", "redis62"])
def q(request: pytest.FixtureRequest, make_queue: Any) -> Iterator[ReliableQueue]:
    """A queue that counts runs when they start (not at the claim), in every script mode."""
    backend, functions = request.param
    client = make_client(request, backend)
    yield make_queue(client, lease_ms=30_000, claim_starts=False, lua_functions=functions)
    client.close()


def _attempts(q: ReliableQueue, msg_id: str, client: Any = None) -> int:
    meta = parse_meta((client or q.client).hget(q.keys.meta, msg_id))
    assert meta is not None
    return int(meta["attempts"])


def test_a_start_sent_counts_before_its_answer_is_read(q: ReliableQueue) -> None:
    q.publish(b"job")
    [d] = q.claim(timeout=1)
    q.start([d], now=True)
    assert len(q._sent) == 1  # answer unread
    watcher = redis.Redis(port=q.client.connection_pool.connection_kwargs["port"])
    wait_for(lambda: _attempts(q, d.id, watcher) == 1, 10, "the report to be run")
    q.collect_starts()
    assert q._sent == [] and q.held == [d]
    q.start([d], now=True)  # the same run reported again counts once
    q.collect_starts()
    assert _attempts(q, d.id) == 1
    assert q.ack(d)
    watcher.close()


def test_a_start_sent_while_the_scripts_were_flushed_runs_again_when_its_answer_is_read(
    q: ReliableQueue
) -> None:
    q.publish(b"job")
    [d] = q.claim(timeout=1)
    q.client.script_flush()
    if q._scripts._functions:
        q.client.execute_command("FUNCTION", "FLUSH")
    q.start([d], now=True)
    q.collect_starts()
    assert _attempts(q, d.id) == 1
    assert q.ack(d)


def test_a_start_whose_answer_was_lost_is_sent_again_with_the_next_beat_and_counts_once(
    server: RedisServer, client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    q = make_queue(redis.Redis(port=server.port), lease_ms=30_000, claim_starts=False)
    q.publish(b"job")
    [d] = q.claim(timeout=1)
    # The server holds the report unrun (writes paused) while its connection is cut: the
    # report never ran, and its answer is lost.
    client.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
    try:
        q.start([d], now=True)
        client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
    assert _attempts(q, d.id, client) == 0
    q.collect_starts()
    assert "got no reply" in caplog.text
    assert d.id in q._starting  # the keeper's next extend carries it
    q.heartbeat()
    assert d.id not in q._starting
    assert _attempts(q, d.id) == 1
    assert q.held == [d] and q.ack(d)
    q.client.close()


KILLED_AFTER_SENDING = """
import os, signal, sys
import redis
from belayq import ConnectionLost, ReliableQueue

q = ReliableQueue(redis.Redis(port=int(sys.argv[1])), sys.argv[2], keeper=False,
                  lease_ms=60_000, claim_starts=False)
[d] = q.claim(timeout=5)
q.start([d], now=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

KILLED_AFTER_SENDING_ELSEWHERE = """
import os, signal, sys
import redis
from belayq import ConnectionLost, ReliableQueue

holder = ReliableQueue(redis.Redis(port=int(sys.argv[1])), sys.argv[2], keeper=False,
                       lease_ms=60_000, claim_starts=False)
[d] = holder.claim(timeout=5)
runner = ReliableQueue(redis.Redis(port=int(sys.argv[1])), sys.argv[2], keeper=False,
                       lease_ms=60_000, claim_starts=False)
runner.send_started([(d.id, d.token)])
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("script", [KILLED_AFTER_SENDING, KILLED_AFTER_SENDING_ELSEWHERE],
                         ids=["start-now", "send_started"])
def test_a_process_killed_right_after_sending_its_start_report_has_the_run_counted(
    server: RedisServer, client: redis.Redis, make_queue: Any, qname: str, script: str
) -> None:
    runs = 12
    q = make_queue(client, lease_ms=60_000, claim_starts=False)
    for i in range(runs):
        q.publish(f"job-{i}".encode())
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", script, str(server.port), qname],
                              capture_output=True, timeout=60, check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    held = [m.decode() for m in client.zrange(q.keys.leases, 0, -1)]
    assert len(held) == runs
    assert [_attempts(q, msg_id) for msg_id in held] == [1] * runs


def test_a_start_on_a_cluster_client_is_answered_before_it_returns(
    request: pytest.FixtureRequest, make_queue: Any
) -> None:
    client = make_client(request, "cluster")
    q = make_queue(client, lease_ms=30_000, claim_starts=False)
    q.publish(b"job")
    [d] = q.claim(timeout=1)
    q.start([d], now=True)
    assert q._sent == [] and _attempts(q, d.id) == 1
    assert q.send_started([(d.id, d.token)])() == [True]
    assert _attempts(q, d.id) == 1 and q.ack(d)
    client.close()


@pytest.mark.parametrize("backend", ["redis", "cluster"])
def test_a_start_report_that_finds_its_claim_lost_forgets_it(
    request: pytest.FixtureRequest, make_queue: Any, backend: str
) -> None:
    """On a plain client when the report's answer is read (the next report or beat); on a
    cluster client, whose report is answered before it returns, at once."""
    client = make_client(request, backend)
    q = make_queue(client, lease_ms=200, claim_starts=False)
    q.publish(b"job")
    [d] = q.claim(timeout=1)
    wait_for(lambda: q.sweep().reclaimed == 1, 10, "the lease to run out and be swept")
    other = make_queue(client, lease_ms=30_000, claim_starts=False)
    [again] = other.claim(timeout=1)
    assert again.id == d.id and again.token != d.token
    q.start([d], now=True)
    q.collect_starts()
    assert q.held == [] and q._starting == set()
    assert _attempts(q, d.id) == 0  # the lost claim's run is not counted
    for queue in (q, other):  # their observations go out on the client before it closes
        queue.close(release=False)
    client.close()


def test_a_child_process_leaves_its_parents_unread_answers_alone(
    q: ReliableQueue
) -> None:
    q.publish(b"job")
    [d] = q.claim(timeout=1)
    q.start([d], now=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if q._sent == [] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    q.collect_starts()
    assert _attempts(q, d.id) == 1 and q.ack(d)


def test_an_ack_sent_lands_before_its_answer_is_read_and_a_lost_answer_holds_the_claims_again(
    server: RedisServer, client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(redis.Redis(port=server.port), lease_ms=30_000)
    for i in range(3):
        q.publish(f"m{i}".encode())
    got = q.claim(timeout=1, count=3)
    answer = q.send_ack_many(got[:2])
    assert q.held == got[2:]  # no longer kept alive while the ack is on its way
    wait_for(lambda: q.stats()["in_flight"] == 1, 10, "the ack to land")
    wait_for(answer.ready, 10, "the answer")
    assert answer() == [True, True]
    # An answer that never comes: the ack is held unrun (writes paused) and its
    # connection cut; the claim is held again, for the caller to settle again.
    client.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
    try:
        answer = q.send_ack_many(got[2:])
        client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
    with pytest.raises(ConnectionLost):
        answer()
    assert q.held == got[2:] and q.stats()["in_flight"] == 1
    assert q.ack_many(got[2:]) == [True]
    q.client.close()
