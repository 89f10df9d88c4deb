"""The lease keeper of a live holder waits on nothing but its extend: a sentinel that stops
answering (SIGSTOP) or answers errors (an ACL that refuses its commands), and a replica
that stops answering under ``wait_replicas``, never let a lease lapse.

Each holder is a real process (``tests/sentinel/holder.py``, or a real ``rq worker``) that
claims one message with a short lease, works for several leases, then acks. Meanwhile a
second consumer on a plain client of the primary claims the same queue in a loop (a claim
sweeps expired leases first), and the holder's connections are closed on the server once,
so its keeper's extends need new connections too. The checks: the second consumer gets
nothing, the holder's ack returns True (RQ: the job is FINISHED, run once), and the queue
counts no stale ack.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job, JobStatus

from belayq import Delivery, ReliableQueue
from belayq.embedded import RedisSentinelServers
from tests.events.workers import Proc, child_env
from tests.support import wait_for

from . import holder, rq_app
from .test_rq_failover import count, settings_module

pytestmark = pytest.mark.timeout(120)

LEASE_MS = 2_500
#: The holder works this long: several leases, each of which must be extended in time.
WORK_S = 4 * LEASE_MS / 1000
#: After the fault, the holder's connections are closed this long later (s).
KILL_AFTER_S = LEASE_MS / 1000
LONG_S = 60.0
RQ_BIN = Path(sys.executable).with_name("rq")


def start_holder(procs: Callable[..., Proc], **opts: Any) -> Proc:
    return procs([sys.executable, "-m", "tests.sentinel.holder", json.dumps(opts)], child_env())


def said(proc: Proc, word: str) -> list[str] | None:
    for line in proc.text().splitlines():
        parts = line.split()
        if parts and parts[0] == word:
            return parts
    return None


def finished(proc: Proc) -> list[str] | None:
    return said(proc, "acked") or said(proc, "error")


def close_connections(port: int, pick: Callable[[dict[str, Any]], bool]) -> int:
    """Close the connections of the server on ``port`` that ``pick`` selects (CLIENT KILL)."""
    with redis.Redis(port=port) as admin:
        me = admin.client_id()
        ids = [c["id"] for c in admin.client_list() if int(c["id"]) != me and pick(c)]
        for cid in ids:
            admin.client_kill_filter(_id=cid)
    return len(ids)


@contextmanager
def stopped(proc: subprocess.Popen[bytes] | None) -> Iterator[None]:
    """SIGSTOP ``proc`` for the block (it accepts connections, never answers)."""
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


def steal_until(port: int, qname: str, done: Callable[[], Any], **options: Any) -> list[Delivery]:
    """Claim ``qname`` on a plain client of the primary until ``done()``: whatever this
    second consumer gets was taken from a holder whose lease lapsed."""
    client = redis.Redis(port=port, socket_timeout=5)
    thief = ReliableQueue(client, qname, keeper=False, **options)
    stolen: list[Delivery] = []
    deadline = time.monotonic() + WORK_S + 30
    try:
        while not done():
            assert time.monotonic() < deadline, f"the holder never acked; stolen: {stolen}"
            stolen += thief.claim(timeout=0.2)
    finally:
        client.close()
    return stolen


def check_holder(group: RedisSentinelServers, proc: Proc, qname: str, stolen: list[Delivery],
                 **options: Any) -> None:
    end = finished(proc)
    assert not stolen, (
        f"a second consumer got the message while its holder worked: {stolen}\n"
        f"{proc.text()[-3000:]}"
    )
    assert end is not None and end[:2] == ["acked", "True"], proc.text()[-3000:]
    with redis.Redis(port=group.primary.port) as c:
        s = ReliableQueue(c, qname, keeper=False, **options).stats()
    assert (s.get("stale_acks", 0), s["acked"], s["in_flight"], s["ready"]) == (0, 1, 0, 0), s


def run_holder(
    group: RedisSentinelServers,
    procs: Callable[..., Proc],
    qname: str,
    fault: Callable[[], Any],
    *,
    client: str,
) -> None:
    """A holder on ``client``; ``fault()`` is a context manager entered once it claimed."""
    port = group.primary.port
    with redis.Redis(port=port) as c:
        ReliableQueue(c, qname, keeper=False).publish(b"long work")
    proc = start_holder(
        procs, client=client, sentinels=group.sentinel_addresses, service=group.service_name,
        port=port, queue=qname, queue_options={"lease_ms": LEASE_MS}, work_s=WORK_S,
    )
    wait_for(lambda: said(proc, "claimed"), LONG_S, lambda: f"a claim: {proc.text()}")
    with fault():
        faulted = time.monotonic()
        closed = False

        def done() -> bool:
            nonlocal closed
            if not closed and time.monotonic() > faulted + KILL_AFTER_S:
                closed = bool(close_connections(port, lambda c: c["name"] == holder.NAME))
            return finished(proc) is not None

        stolen = steal_until(port, qname, done)
    assert closed, "the holder's connections were never closed"
    check_holder(group, proc, qname, stolen)


@pytest.mark.parametrize("client", ["readme", "docs"])
def test_a_stopped_sentinel_never_lets_a_live_holders_lease_lapse(
    start_sentinels: Callable[..., RedisSentinelServers],
    procs: Callable[..., Proc],
    qname: str,
    client: str,
) -> None:
    """The sentinel a Sentinel-managed client asks first stops answering (SIGSTOP)."""
    group = start_sentinels()
    run_holder(group, procs, qname, lambda: stopped(group.sentinels[0].proc), client=client)


@contextmanager
def refusing(port: int) -> Iterator[None]:
    """The sentinel on ``port`` answers every primary lookup with NOPERM (an ACL)."""
    rules = ["-sentinel|masters", "-sentinel|master", "-sentinel|get-master-addr-by-name"]
    with redis.Redis(port=port) as sentinel:
        sentinel.execute_command("ACL", "SETUSER", "default", *rules)
        with pytest.raises(redis.exceptions.NoPermissionError):
            sentinel.execute_command("SENTINEL", "MASTERS")
        try:
            yield
        finally:
            sentinel.execute_command("ACL", "SETUSER", "default", "+@all")


def test_a_sentinel_answering_errors_never_lets_a_live_holders_lease_lapse(
    start_sentinels: Callable[..., RedisSentinelServers],
    procs: Callable[..., Proc],
    qname: str,
) -> None:
    group = start_sentinels()
    run_holder(group, procs, qname, lambda: refusing(group.sentinels[0].port), client="docs")


def test_a_stopped_replica_under_wait_replicas_never_lets_a_live_holders_lease_lapse(
    start_sentinels: Callable[..., RedisSentinelServers],
    procs: Callable[..., Proc],
    qname: str,
    tmp_path: Path,
) -> None:
    """One replica, ``wait_replicas=1``, ``wait_timeout_ms`` at 0.9 of the lease: the
    replica stops answering while the holder works; it answers again before the ack."""
    group = start_sentinels(replicas=1)
    port = group.primary.port
    options = {"lease_ms": LEASE_MS, "wait_replicas": 1, "wait_timeout_ms": LEASE_MS * 9 // 10}
    with redis.Redis(port=port) as c:
        ReliableQueue(c, qname, keeper=False, **options).publish(b"long work")
    go = tmp_path / "go"
    proc = start_holder(procs, client="plain", port=port, queue=qname, queue_options=options,
                        work_s=WORK_S, go_file=str(go))
    claimed = wait_for(lambda: said(proc, "claimed"), LONG_S, lambda: f"a claim: {proc.text()}")
    replica = group.servers[1]
    with stopped(replica.proc):
        stolen = steal_until(port, qname, lambda: time.monotonic() > float(claimed[2]) + WORK_S)
    with redis.Redis(port=replica.port) as r:
        wait_for(lambda: r.info("replication")["master_link_status"] == "up", LONG_S, "a link")
    go.touch()
    stolen += steal_until(port, qname, lambda: finished(proc) is not None)
    check_holder(group, proc, qname, stolen, **options)


def test_a_stopped_sentinel_never_lets_an_rq_workers_lease_lapse(
    start_sentinels: Callable[..., RedisSentinelServers],
    procs: Callable[..., Proc],
    tmp_path: Path,
    qname: str,
) -> None:
    """A real ``rq worker -w belayq_rq.Worker`` on RQ's ``SENTINEL`` settings (no sentinel
    timeout) runs a job for several leases while the sentinel it asks first is stopped, and
    its connections are closed once."""
    group = start_sentinels()
    port = group.primary.port
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    path = tmp_path / "runs.log"
    with redis.Redis(port=port) as c:
        job_id = str(rq_app.SentinelQueue(qname, connection=c).enqueue(
            rq_app.work, WORK_S, str(path)).id)
    worker = procs(
        [str(RQ_BIN), "worker", "-c", settings_module(tmp_path, group), "-w", "belayq_rq.Worker",
         "--queue-class", "tests.sentinel.rq_app.SentinelQueue", "--logging_level", "INFO",
         qname],
        env,
    )
    wait_for(lambda: count(path, "start"), LONG_S, lambda: f"the job to start: {worker.text()}")
    lease = rq_app.LEASE_MS / 1000
    with stopped(group.sentinels[0].proc):
        faulted = time.monotonic()
        closed = False

        def done() -> bool:
            nonlocal closed
            if not closed and time.monotonic() > faulted + lease:
                closed = bool(close_connections(
                    port, lambda c: c["flags"] == "N" and not c["name"].startswith("sentinel-")))
            return bool(count(path, "done"))

        with redis.Redis(port=port) as c:
            core = rq_app.SentinelQueue(qname, connection=c).belayq()
            stolen: list[Delivery] = []
            deadline = time.monotonic() + LONG_S
            while not done():
                assert time.monotonic() < deadline, f"the job never ended: {worker.text()}"
                stolen += core.claim(timeout=0.2)
            assert not stolen, f"a second consumer got the job while it ran: {stolen}"
            job = Job.fetch(job_id, connection=c)
            wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, LONG_S,
                     lambda: f"the job to finish: {worker.text()[-3000:]}")
            s = core.stats()
    assert closed, "the worker's connections were never closed"
    assert count(path, "start") == 1, "the job ran twice"
    assert (s.get("stale_acks", 0), s["acked"], s["in_flight"]) == (0, 1, 0), s
    assert worker.alive(), worker.text()[-3000:]
