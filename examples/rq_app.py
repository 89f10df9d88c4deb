"""An RQ app on belayq, and what happens when its workers crash.

Run it: ``python examples/rq_app.py`` (exits 0 when every step behaved as described).

The app is plain RQ: producers use ``rq.Queue(...).enqueue`` unchanged. Only the worker
command changes, from ``rq worker`` to ``rq worker -w belayq_rq.Worker`` (here a subclass
with a 3 s lease, so the walkthrough takes seconds instead of the default 20 s).

The walkthrough, on a private redis-server:

1. Three jobs are enqueued; worker A takes the first.
2. ``kill -9`` of worker A and its work horse, mid-job. Stock RQ would leave the job
   "started" and, about ten minutes later, fail it with AbandonedJobError, never running it
   again. With belayq its lease stops being renewed, and worker B runs it again about one
   lease later. All three jobs finish.
3. A job whose work horse is SIGKILLed (as the OOM killer does) while the worker lives:
   stock RQ fails it at once; belayq hands it back and it runs again at once.
4. A "poison" job that kills its work horse every time: after ``max_deliveries`` (3) lost
   attempts it lands in RQ's FailedJobRegistry, with the reason, instead of looping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rq import get_current_job

import belayq_rq

HERE = Path(__file__).resolve().parent


class DemoQueue(belayq_rq.Queue):
    lease_ms = 3_000
    max_deliveries = 3


class DemoWorker(belayq_rq.Worker):
    queue_class = DemoQueue


def resize_image(n: int) -> str:
    """A job: pretends to work for 2 s, and notes where and when each attempt ran."""
    job = get_current_job()
    assert job is not None
    job.connection.rpush(f"demo:attempts:{job.id}", f"{os.getpid()} {time.time():.3f}")
    time.sleep(2)
    return f"image-{n}.png"


def oom_once() -> str:
    """A job whose first work horse is killed as the OOM killer would."""
    job = get_current_job()
    assert job is not None
    first = job.connection.rpush(f"demo:attempts:{job.id}", str(os.getpid())) == 1
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
    return "done on the second try"


def poison() -> None:
    """A job that kills its work horse every time it runs."""
    job = get_current_job()
    assert job is not None
    job.connection.rpush(f"demo:attempts:{job.id}", str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    import redis
    import rq
    from rq.job import JobStatus
    from rq.registry import FailedJobRegistry

    from belayq.embedded import RedisServer

    sys.path.insert(0, str(HERE))
    import rq_app  # the jobs must be importable by the workers: use this module's name

    server = RedisServer().start()
    conn = redis.Redis(port=server.port)
    url = server.url
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    rq_bin = str(Path(sys.executable).with_name("rq"))
    procs: list[subprocess.Popen[bytes]] = []

    def worker(name: str) -> subprocess.Popen[bytes]:
        cmd = [rq_bin, "worker", "-u", url, "-w", "rq_app.DemoWorker", "-n", name, "-q", "images"]
        p = subprocess.Popen(cmd, env=env, cwd=HERE, start_new_session=True)
        procs.append(p)
        return p

    def attempts(job_id: str) -> list[str]:
        return [a.decode() for a in conn.lrange(f"demo:attempts:{job_id}", 0, -1)]

    def wait(what: str, cond: object, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise SystemExit(f"FAILED: timed out waiting for {what}")
            time.sleep(0.05)

    ok = True
    try:
        queue = rq.Queue("images", connection=conn)  # a stock producer
        print("1. enqueue 3 jobs with a stock rq.Queue; start worker A "
              "(rq worker -w rq_app.DemoWorker)")
        jobs = [queue.enqueue(rq_app.resize_image, n) for n in range(3)]
        a = worker("A")
        wait("job 0 to start on worker A", lambda: attempts(jobs[0].id))
        horse_pid = int(attempts(jobs[0].id)[0].split()[0])

        print(f"2. kill -9 worker A (pid {a.pid}) and its work horse (pid {horse_pid}) mid-job")
        os.kill(horse_pid, signal.SIGKILL)
        os.kill(a.pid, signal.SIGKILL)
        killed = time.time()
        a.wait()
        worker("B")
        wait("job 0 to run again", lambda: len(attempts(jobs[0].id)) >= 2)
        again = float(attempts(jobs[0].id)[1].split()[1])
        print(f"   job 0 is running again on worker B {again - killed:.1f} s after the kill "
              f"(lease {DemoQueue.lease_ms / 1000:.0f} s; stock RQ: FAILED ~10 min later)")
        wait("the 3 jobs to finish",
             lambda: all(j.get_status() == JobStatus.FINISHED for j in jobs))
        for j in jobs:
            print(f"   {j.id[:8]} {j.get_status().value}: {j.return_value()!r}, "
                  f"{len(attempts(j.id))} attempt(s)")
        ok &= len(attempts(jobs[0].id)) == 2 and all(len(attempts(j.id)) == 1 for j in jobs[1:])

        print("3. a work horse SIGKILLed while its worker lives (the OOM killer)")
        oom = queue.enqueue(rq_app.oom_once)
        wait("the job to finish", lambda: oom.get_status() == JobStatus.FINISHED)
        print(f"   {oom.get_status().value} after {len(attempts(oom.id))} attempts: "
              f"{oom.return_value()!r} (stock RQ: FAILED)")
        ok &= len(attempts(oom.id)) == 2

        print("4. a poison job that kills its work horse every time")
        bad = queue.enqueue(rq_app.poison)
        wait("the job to fail", lambda: bad.get_status() == JobStatus.FAILED)
        reason = bad.latest_result().exc_string if bad.latest_result() else ""
        in_failed = bad.id in FailedJobRegistry("images", connection=conn)
        print(f"   {bad.get_status().value} after {len(attempts(bad.id))} attempts; "
              f"in FailedJobRegistry: {in_failed}\n   reason: {reason}")
        ok &= in_failed and len(attempts(bad.id)) == DemoQueue.max_deliveries
        ok &= "max_deliveries=3" in (reason or "")

        stats = DemoQueue("images", connection=conn).belayq().stats()
        print(f"belayq counters: claimed {stats.get('claimed')}, acked {stats.get('acked')}, "
              f"redelivered after a lease expired {stats.get('reclaimed', 0)}, "
              f"handed back by a live worker {stats.get('nacked', 0)}, "
              f"in flight now {stats['in_flight']}")
        ok &= stats["in_flight"] == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        server.stop()
    print("OK: every job ran to its end" if ok else "FAILED: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
