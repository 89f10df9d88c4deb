"""A Dramatiq app on belayq, and what happens when its workers crash or its actors fail.

Run it: ``python examples/dramatiq_app.py`` (exits 0 when every step behaved as described).

The app is plain Dramatiq: actors and ``.send()`` unchanged. Only the broker changes, from
``RedisBroker(url=...)`` to ``belayq_dramatiq.Broker(url=...)`` (here with a 3 s lease, so
the walkthrough takes seconds instead of the default 20 s).

The walkthrough, on a private redis-server, with the ``dramatiq`` command as the worker:

1. Three messages are sent; worker A takes the first.
2. ``kill -9`` of worker A (its whole process group), mid-message. Stock RedisBroker would
   find the message again only after its worker's 60 s heartbeat timeout, at a maintenance
   pass that runs on 0.1% of fetches. With belayq its lease stops being renewed, and
   worker B runs it again about one lease later. All three finish.
3. A message whose actor raises on its first run: Dramatiq's ``Retries`` sends it again,
   its backoff waiting in Redis, and the retry succeeds.
4. A message whose actor always raises: after its retries it is one dead letter, with the
   reason and every run counted; ``replay_dead`` (what ``belayq replay`` does) runs it again
   with all its retries.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import redis

import belayq_dramatiq

HERE = Path(__file__).resolve().parent


def main() -> int:
    from belayq.embedded import RedisServer

    server = RedisServer().start()
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "DRAMATIQ_APP_URL": server.url}
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import dramatiq_app; "
        "sys.exit(dramatiq_app.walkthrough())"
    )
    try:
        return subprocess.run([sys.executable, "-c", code, str(HERE)], env=env,
                              cwd=HERE).returncode
    finally:
        server.stop()


if __name__ == "__main__":  # the program: a private server first, then the walkthrough
    sys.exit(main())

# The app, as the `dramatiq` command and the walkthrough import it.
URL = os.environ.get("DRAMATIQ_APP_URL", "redis://localhost:6379/0")

broker = belayq_dramatiq.Broker(url=URL, lease_ms=3_000)
dramatiq.set_broker(broker)
notes = redis.Redis.from_url(URL)


@dramatiq.actor(queue_name="images", max_retries=0)
def resize_image(n: int) -> str:
    """Pretends to work for 2 s, and notes where and when each run started."""
    notes.rpush(f"demo:runs:image-{n}", f"{os.getpid()} {time.time():.3f}")
    time.sleep(2)
    return f"image-{n}.png"


@dramatiq.actor(queue_name="images", max_retries=3, min_backoff=200, max_backoff=400)
def flaky(key: str) -> None:
    """Raises on its first run only."""
    if notes.rpush(f"demo:runs:{key}", str(os.getpid())) == 1:
        raise ConnectionError("the mail server did not answer")


@dramatiq.actor(queue_name="images", max_retries=2, min_backoff=100, max_backoff=200)
def broken(key: str) -> None:
    """Raises on every run."""
    notes.rpush(f"demo:runs:{key}", str(os.getpid()))
    raise ValueError("the template is missing")


def walkthrough() -> int:
    """The steps of the module doc, in a process whose broker is on the private server."""
    dramatiq_bin = str(Path(sys.executable).with_name("dramatiq"))
    procs: list[subprocess.Popen[bytes]] = []
    core = broker.store("images").core

    def worker(name: str) -> subprocess.Popen[bytes]:
        cmd = [dramatiq_bin, "dramatiq_app", "--processes", "1", "--threads", "2",
               "--queues", "images"]
        p = subprocess.Popen(cmd, cwd=HERE, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        print(f"   worker {name}: `dramatiq dramatiq_app` (pid {p.pid})")
        return p

    def runs(key: str) -> list[str]:
        return [r.decode() if isinstance(r, bytes) else r
                for r in notes.lrange(f"demo:runs:{key}", 0, -1)]

    def wait(what: str, cond: object, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise SystemExit(f"FAILED: timed out waiting for {what}")
            time.sleep(0.05)

    ok = True
    try:
        print("1. send 3 messages (resize_image.send(n)); start worker A")
        for n in range(3):
            resize_image.send(n)
        a = worker("A")
        wait("image-0 to start on worker A", lambda: runs("image-0"))

        print("2. kill -9 worker A's processes mid-message")
        os.killpg(a.pid, signal.SIGKILL)
        killed = time.time()
        a.wait()
        worker("B")
        wait("image-0 to run again", lambda: len(runs("image-0")) >= 2)
        again = float(runs("image-0")[-1].split()[1])
        print(f"   image-0 is running again on worker B {again - killed:.1f} s after the kill "
              f"(lease {broker.options['lease_ms'] / 1000:.0f} s)")
        wait("the 3 messages to finish", lambda: all(runs(f"image-{n}") for n in range(3))
             and core.stats().get("acked", 0) >= 3)
        counts = [len(runs(f"image-{n}")) for n in range(3)]
        print(f"   runs of image-0..2: {counts}")
        ok &= counts[0] == 2 and counts[1:] in ([1, 1], [1, 2], [2, 1])

        print("3. an actor that raises once: Dramatiq's Retries sends it again")
        flaky.send("flaky")
        wait("the retry to succeed", lambda: len(runs("flaky")) == 2 and broker.store(
            "images").size() == 0)
        print(f"   {len(runs('flaky'))} runs; its backoff waited in Redis (promoted "
              f"{core.stats().get('promoted', 0)})")
        ok &= core.stats().get("promoted", 0) >= 1

        print("4. an actor that always raises (max_retries=2)")
        broken.send("broken")
        wait("its dead letter", lambda: len(core.dead_letters()) == 1)
        [dead] = core.dead_letters()
        print(f"   dead letter after {len(runs('broken'))} runs: {dead.reason!r}, "
              f"deliveries {dead.deliveries}, runs {dead.attempts}")
        ok &= len(runs("broken")) == 3 and (dead.deliveries, dead.attempts) == (3, 3)
        core.replay_dead()
        wait("the replay's runs", lambda: len(runs("broken")) == 6
             and len(core.dead_letters()) == 1)
        print(f"   replayed: {len(runs('broken')) - 3} more runs, then a dead letter again")

        stats = core.stats()
        print(f"belayq counters: claimed {stats.get('claimed', 0)}, acked {stats.get('acked', 0)}, "
              f"redelivered after a lease expired {stats.get('reclaimed', 0)}, "
              f"dead-lettered {stats.get('dead_lettered', 0)}, in flight now {stats['in_flight']}")
        ok &= stats["in_flight"] == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        broker.close()
    print("OK: every message ran to its end" if ok else "FAILED: see above")
    return 0 if ok else 1
