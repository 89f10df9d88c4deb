"""What tracing costs: the core's publish, claim + ack and whole publish + claim + ack
loops with ``belayq.otel``'s instrumentation off and on, in one run.

Run from the repository root::

    uv run python -m benchmarks.core.otel [--n 5000] [--reps 3]

Off is the plain code: nothing is wrapped until ``BelayqInstrumentor().instrument()``. On
is the SDK with every span sampled and handed to a batch processor whose exporter drops
them (what a service that exports its traces pays in its own process, before the
network). Each rep runs off, then on, then off again, on a private redis-server (a free
port); the table shows medians with min-max, the ratio on/off, the round trips per
message and the server's time per message (``INFO commandstats`` usec: the scripts, and
the contexts' HMGET when on) on each side. Last, the Redis memory a waiting message takes
(``INFO memory`` delta over ``--n`` messages), untraced and traced: the context it carries.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import redis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from redis.connection import Connection

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.otel import BelayqInstrumentor
from benchmarks.core.counting import server_calls
from benchmarks.stats import med, spread, table


class _Dropped(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _publish(q: ReliableQueue, n: int) -> None:
    for _ in range(n):
        q.publish(b"x")


def _claim_ack(q: ReliableQueue, n: int) -> None:
    for _ in range(n):
        [d] = q.claim(timeout=0)
        q.ack(d)


def _cycle(q: ReliableQueue, n: int) -> None:
    for _ in range(n):
        q.publish(b"x")
        [d] = q.claim(timeout=0)
        q.ack(d)


def _timed(client: redis.Redis, loop: Callable[[ReliableQueue, int], None], n: int,
           prepare: bool) -> tuple[float, float, float]:
    """(messages/s, round trips per message, server usec per message) of ``loop`` on a
    fresh queue."""
    client.flushall()
    q = ReliableQueue(client, "otel-bench", keeper=False)
    if prepare:
        q.publish_many([b"x"] * n)
    sent = [0]
    original: Callable[..., Any] = Connection.send_packed_command

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent[0] += 1
        return original(self, *args, **kwargs)

    # patch.object puts the class back as it was (an inherited method assigned back would
    # stay on Connection, hiding any later patch of its base class)
    _, _, usec0 = server_calls(client)
    with mock.patch.object(Connection, "send_packed_command", counted):
        t0 = time.perf_counter()
        loop(q, n)
        elapsed = time.perf_counter() - t0
        q.close(release=False)
    _, _, usec1 = server_calls(client)
    return n / elapsed, sent[0] / n, (usec1 - usec0) / n


def _bytes_per_waiting(client: redis.Redis, n: int) -> float:
    """Redis memory per message published and waiting (the current tracing setting)."""
    client.flushall()
    q = ReliableQueue(client, "otel-bench", keeper=False)
    q.publish(b"x")  # the queue's own keys exist before the measure
    before = int(client.info("memory")["used_memory"])
    for _ in range(n):
        q.publish(b"x")
    after = int(client.info("memory")["used_memory"])
    q.close(release=False)
    return (after - before) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    loops = {"publish": (_publish, False), "claim + ack, count=1": (_claim_ack, True),
             "publish + claim + ack": (_cycle, False)}
    rates: dict[tuple[str, str], list[float]] = {}
    trips: dict[tuple[str, str], float] = {}
    server: dict[tuple[str, str], list[float]] = {}
    memory: dict[str, list[float]] = {}
    with RedisServer() as srv:
        client = redis.Redis(port=srv.port)
        for _ in range(args.reps):
            for side in ("off", "on", "off"):
                if side == "on":
                    BelayqInstrumentor().instrument(tracer_provider=provider)
                try:
                    for name, (loop, prepare) in loops.items():
                        rate, rt, usec = _timed(client, loop, args.n, prepare)
                        rates.setdefault((name, side), []).append(rate)
                        server.setdefault((name, side), []).append(usec)
                        trips[(name, side)] = rt
                    memory.setdefault(side, []).append(_bytes_per_waiting(client, args.n))
                finally:
                    if side == "on":
                        BelayqInstrumentor().uninstrument()
        provider.shutdown()
    rows = []
    for name in loops:
        off, on = rates[(name, "off")], rates[(name, "on")]
        s_off, s_on = server[(name, "off")], server[(name, "on")]
        rows.append([name, spread(off, ",.0f"), spread(on, ",.0f"), f"{med(on) / med(off):.2f}x",
                     f"{trips[(name, 'off')]:.2f} / {trips[(name, 'on')]:.2f}",
                     f"{med(s_off):.1f} / {med(s_on):.1f}", f"{med(s_on) / med(s_off):.2f}x"])
    print(f"n={args.n}, reps={args.reps} (off, on, off in each), msg/s, medians (min-max)\n")
    print(table(["loop", "tracing off", "tracing on", "on/off", "round trips/msg off / on",
                 "server usec/msg off / on", "server on/off"], rows))
    off_b, on_b = med(memory["off"]), med(memory["on"])
    print(f"\nRedis memory per waiting message: {off_b:,.0f} B untraced, {on_b:,.0f} B traced "
          f"({on_b / off_b:.2f}x; the context rides in the queue's meta hash and goes with "
          "the message)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
