"""A real ``rq worker`` (``belayq_rq``'s forking worker, configured with RQ's own
``SENTINEL`` settings: ``rq worker -c <settings module>``) through a Sentinel failover: the
primary is SIGKILLed while jobs run and a replica is promoted. With ``wait_replicas=1``:

* every job finishes, none FAILED, and the workers were never restarted;
* a job runs twice only if it was running when the replicas stopped getting writes (at the
  kill; or, in the "cut-then-kill" run, at a replication cut 0.5 s before it): its claim or
  its end, which RQ records in its own transaction, may not have reached the promoted
  replica;
* jobs enqueued after the failover run too;
* the recovery time (kill to the first job started on the new primary) is printed.

The jobs are enqueued, and on both replicas, before the run: RQ's enqueue is RQ's own
write, which belayq does not make wait for replicas (docs/sentinel.md).
"""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

from belayq.embedded import RedisSentinelServers
from tests.events.workers import Proc, child_env
from tests.support import wait_for

from . import rq_app
from .harness import master_client, replicas_caught_up, replication_cut

pytestmark = pytest.mark.timeout(150)

RQ_BIN = Path(sys.executable).with_name("rq")
JOBS = 40
JOBS_AFTER = 10
JOB_S = 0.15
WORKERS = 2
#: A job whose run ended this long before the replicas stopped getting writes had its end
#: recorded (RQ's end-of-job transaction, with belayq's ack) on them by then.
END_RECORDED_S = 0.5
#: How long replication is cut before the kill, in the "cut-then-kill" run (s).
CUT_S = 0.5
LONG_S = 60.0


def settings_module(folder: Path, group: RedisSentinelServers) -> str:
    """An RQ settings module (``rq worker -c``) that names the sentinels, as a user's."""
    (folder / "sentinel_settings.py").write_text(
        "SENTINEL = {\n"
        f"    'INSTANCES': {group.sentinel_addresses!r},\n"
        f"    'MASTER_NAME': {group.service_name!r},\n"
        "    'DB': 0,\n"
        "    'SOCKET_TIMEOUT': 5,\n"
        "}\n"
    )
    return "sentinel_settings"


def notes(path: Path) -> dict[str, list[tuple[str, float]]]:
    """Job id -> its (event, monotonic s) notes, in order."""
    out: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            event, job_id, _pid, at = line.split()
            out[job_id].append((event, float(at)))
    return out


def count(path: Path, event: str, after: float = 0.0) -> int:
    return sum(1 for ns in notes(path).values() for e, at in ns if e == event and at > after)


def enqueue(queue: rq_app.SentinelQueue, path: Path) -> str:
    """Enqueue one job, trying again while the primary is away."""
    deadline = time.monotonic() + LONG_S
    while True:
        try:
            return str(queue.enqueue(rq_app.work, JOB_S, str(path)).id)
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            assert time.monotonic() < deadline, "no primary to enqueue on"
            time.sleep(0.05)


def statuses(client: redis.Redis, ids: list[str]) -> collections.Counter[str]:
    return collections.Counter(
        str(getattr(st, "value", st)) if j and (st := j.get_status(refresh=False)) else "missing"
        for j in Job.fetch_many(ids, connection=client)
    )


@pytest.mark.parametrize("cut", [False, True], ids=["kill", "cut-then-kill"])
def test_rq_worker_through_a_sentinel_failover(
    start_sentinels: Callable[..., RedisSentinelServers],
    procs: Callable[..., Proc],
    tmp_path: Path,
    qname: str,
    cut: bool,
) -> None:
    # 2 s of silence before a sentinel deems a server down: forked RQ workers load the
    # machine, and a primary stalled for 1 s there was failed over a second time.
    group = start_sentinels(down_after_ms=2000)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    settings = settings_module(tmp_path, group)
    path = tmp_path / "runs.log"
    client = master_client(group)
    try:
        queue = rq_app.SentinelQueue(qname, connection=client)
        ids = [enqueue(queue, path) for _ in range(JOBS)]
        replicas_caught_up(group)
        workers = [
            procs(
                [
                    str(RQ_BIN),
                    "worker",
                    "-c",
                    settings,
                    "-w",
                    "tests.sentinel.rq_app.SentinelWorker",
                    "--logging_level",
                    "INFO",
                    qname,
                ],
                env,
            )
            for _ in range(WORKERS)
        ]
        wait_for(lambda: count(path, "done") >= JOBS // 3, LONG_S, "jobs before the kill")
        if cut:
            with replication_cut(group) as replicated_until:
                time.sleep(CUT_S)  # the window's length: jobs run, end and are acked
                old = group.kill_primary()
        else:
            replicated_until = time.monotonic()
            old = group.kill_primary()
        killed = time.monotonic()
        group.wait_for_new_primary(old, timeout=LONG_S)
        wait_for(lambda: count(path, "start", killed), LONG_S, "a job started after the kill")
        recovery_s = (
            min(at for ns in notes(path).values() for e, at in ns if e == "start" and at > killed)
            - killed
        )
        ids += [enqueue(queue, path) for _ in range(JOBS_AFTER)]
        # Through the sentinels: the checks read (and RQ's registry cleans up on) whatever
        # server is the primary now.
        with master_client(group) as survivor:
            wait_for(
                lambda: statuses(survivor, ids)["finished"] == len(ids),
                LONG_S,
                lambda: f"every job to finish: {dict(statuses(survivor, ids))}",
            )
            failed = FailedJobRegistry(qname, connection=survivor)
            assert failed.count == 0, f"FAILED: {failed.get_job_ids()}"
            assert all(
                j is not None and j.get_status(refresh=False) == JobStatus.FINISHED
                for j in Job.fetch_many(ids, connection=survivor)
            )
        assert all(w.alive() for w in workers), "a worker died in the failover"
    finally:
        client.close()
    seen = notes(path)
    twice = {j: ns for j, ns in seen.items() if sum(e == "start" for e, _ in ns) > 1}
    for job_id, ns in twice.items():
        first_start = ns[0][1]
        first_done = next((at for e, at in ns if e == "done"), None)
        assert first_start < killed, f"{job_id} first started after the kill, ran twice: {ns}"
        assert first_done is None or first_done > replicated_until - END_RECORDED_S, (
            f"{job_id} ended {replicated_until - first_done:.2f} s before the replicas "
            f"stopped getting writes, and ran again: {ns}"
        )
    assert set(seen) == set(ids), "a job never ran, or something else ran"
    title = "cut, then kill" if cut else "kill"
    print(
        f"\n[rq sentinel failover, {title}] {len(ids)} jobs, {JOBS_AFTER} enqueued after the "
        f"kill, all finished, none failed; ran twice: {len(twice)}; first job started on the "
        f"new primary {recovery_s:.2f} s after the kill"
    )
