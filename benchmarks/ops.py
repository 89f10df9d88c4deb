"""What the operator's tools cost the server, and how it grows with the rest of the database.

Run from the repository root::

    uv run python -m benchmarks.ops [--queues 200] [--keys 1000000] [--messages 1000000]
                                    [--reps 5]

On a redis-server started here (``belayq.embedded.RedisServer``, a free port, never 6379):

1. ``--queues`` queues are opened as a fleet would: a third belayq's own, a third Celery's
   (kombu layout), a third RQ's, each with a few waiting messages and one held claim;
2. three calls are measured, ``--reps`` times each (median):

   * ``belayq queues --json`` (the command's own ``main``, in this process);
   * one exporter scrape (``QueueCollector`` over every queue found, rendered by
     ``prometheus_client.generate_latest``, as ``belayq exporter`` serves it);
   * the dashboard's overview (``Dashboard.overview()``): its first look, which opens every
     queue (reads its recorded settings), and a later one, what the page asks every refresh
     (the queues of one server read in one pipeline);
   * one dashboard queue page (``Dashboard.detail()``: counts, the first 50 of each list,
     the framework's failures, the per-minute history of a day, the actions log) of a
     queue holding ``--messages`` messages (ready, 100 held, 1,000 dead), with a day of
     per-minute snapshots, and one message's detail there;

   each with the server's time (``INFO commandstats``: the usec of every command the call
   sent, ``INFO`` and ``CONFIG RESETSTAT`` left out) and the number of commands;
3. ``--keys`` unrelated keys are added (``DEBUG POPULATE``: strings, as RQ's job hashes and
   Celery's results are keys of their own), and the three calls are measured again.

The costs should be flat: the tools find queues through belayq's registry and the
frameworks' own lists of their queues, never by scanning the keyspace. Targets: at most
50 ms of server time per call with 1,000,000 unrelated keys; the overview answered in at
most 100 ms (wall, this process) with 200 queues, the queue page in at most 50 ms with
1,000,000 messages.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis

from belayq import ReliableQueue
from belayq.cli import main as cli_main
from belayq.embedded import RedisServer
from belayq.keys import kombu_layout, rq_layout

SKIPPED = ("cmdstat_info", "cmdstat_config", "cmdstat_config|resetstat")


def fleet(client: redis.Redis, queues: int) -> None:
    for i in range(queues):
        name = f"q{i:03d}"
        layout: dict[str, Any] = {}
        if i % 3 == 1:
            layout = kombu_layout(name)
        elif i % 3 == 2:
            layout = rq_layout(name)
        q = ReliableQueue(client, name, keeper=False, **layout)
        q.publish_many([f"{name}-{j}".encode() for j in range(5)])
        q.claim(timeout=0)


def big_queue(client: redis.Redis, messages: int) -> ReliableQueue:
    """A belayq queue of ``messages`` messages: ready, 100 held, 1,000 dead, and a day of
    per-minute snapshots of its counters."""
    from belayq.rollups import COUNTERS, KEEP_MINUTES, MINUTE_MS

    q = ReliableQueue(client, "big", keeper=False)
    batch = [b"x" * 100] * 1000
    for _ in range(messages // len(batch)):
        q.publish_many(batch)
    for d in q.claim(timeout=0, count=1000):
        q.dead_letter(d, "failed in the benchmark")
    q.claim(timeout=0, count=100)
    seconds, _ = client.time()
    now = int(seconds) * 1000 // MINUTE_MS
    client.hset(q.keys.rollups, mapping={
        str(now - m): " ".join(str((KEEP_MINUTES - m) * 10) for _ in COUNTERS)
        for m in range(KEEP_MINUTES)})
    return q


def server_cost(client: redis.Redis, call: Callable[[], Any]) -> tuple[float, int, float]:
    """(server ms, commands, wall ms) of one ``call``."""
    client.config_resetstat()
    t0 = time.perf_counter()
    call()
    wall = (time.perf_counter() - t0) * 1000
    usec = calls = 0
    for name, stat in client.info("commandstats").items():
        if name not in SKIPPED:
            usec += int(stat["usec"])
            calls += int(stat["calls"])
    return usec / 1000, calls, wall


def the_calls(client: redis.Redis, url: str, big: ReliableQueue) -> dict[str, Callable[[], Any]]:
    from prometheus_client import CollectorRegistry, generate_latest

    from belayq.discovery import list_queues, open_found
    from belayq.metrics import QueueCollector
    from belayq.web import console
    from belayq.web.app import Dashboard

    def queues() -> None:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert cli_main(["queues", "--url", url, "--json"]) == 0
        assert out.getvalue().count("\n") >= 1

    def scrape() -> None:
        registry = CollectorRegistry()
        registry.register(QueueCollector(
            lambda: [open_found(client, f) for f in list_queues(client)]))
        assert b"belayq_ready" in generate_latest(registry)

    def first_look() -> None:
        assert Dashboard(client).overview()["queues"]

    board = Dashboard(client)
    board.overview()  # the page's later looks: every queue opened already

    def overview() -> None:
        assert len(board.overview()["queues"]) > 1
    one = big.dead_letters(1)[0].id

    def page() -> None:
        detail = board.detail(*board.queue("belayq", big.name))
        assert len(detail["ready"]) == 50 and len(detail["per_minute"]) > 1000

    def message() -> None:
        assert console.message(big, one)["state"] == "dead"

    return {"belayq queues": queues, "exporter scrape": scrape,
            "overview, first look": first_look, "dashboard overview": overview,
            "dashboard queue page": page, "dashboard message": message}


def measure(client: redis.Redis, url: str, reps: int,
            big: ReliableQueue) -> dict[str, tuple[float, int, float]]:
    out = {}
    for name, call in the_calls(client, url, big).items():
        runs = [server_cost(client, call) for _ in range(reps)]
        out[name] = (statistics.median(r[0] for r in runs), int(statistics.median(
            r[1] for r in runs)), statistics.median(r[2] for r in runs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=200)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with RedisServer(args=["--enable-debug-command", "yes"]) as server:
        client = redis.Redis(port=server.port)
        url = server.url
        version = client.info("server")["redis_version"]
        fleet(client, args.queues)
        big = big_queue(client, args.messages)
        empty = measure(client, url, args.reps, big)
        t0 = time.perf_counter()
        client.execute_command("DEBUG", "POPULATE", args.keys, "app:unrelated")
        filled_in = time.perf_counter() - t0
        full = measure(client, url, args.reps, big)
        total = client.dbsize()
    print(f"redis {version}; {args.queues} queues and one of {args.messages:,} messages; "
          f"then {args.keys:,} unrelated keys "
          f"(DEBUG POPULATE, {filled_in:.1f} s; {total:,} keys in all); median of {args.reps}")
    print(f"{'call':20} {'server ms':>10} {'commands':>9} {'wall ms':>8} | "
          f"{'server ms':>10} {'commands':>9} {'wall ms':>8} | {'server x':>8}")
    print(f"{'':20} {'(no other keys)':>29} | {'(with the unrelated keys)':>29} |")
    worst = 0.0
    for name in empty:
        a, b = empty[name], full[name]
        worst = max(worst, b[0])
        print(f"{name:20} {a[0]:10.2f} {a[1]:9d} {a[2]:8.1f} | {b[0]:10.2f} {b[1]:9d} "
              f"{b[2]:8.1f} | {b[0] / a[0] if a[0] else float('nan'):8.2f}")
    verdict = "met" if worst <= 50 else "MISSED"
    print(f"target: <= 50 ms of server time per call with the unrelated keys: {verdict} "
          f"(worst {worst:.2f} ms)")
    for name, limit in (("dashboard overview", 100), ("dashboard queue page", 50)):
        wall = full[name][2]
        print(f"target: {name} answered in <= {limit} ms (wall) with the unrelated keys: "
              f"{'met' if wall <= limit else 'MISSED'} ({wall:.1f} ms)")


if __name__ == "__main__":
    main()
