"""``python -m belayq_kombu``: inspect queues, replay dead letters, roll back to stock.

The general command is ``belayq`` (``belayq dead --url belayq://... celery``); these stay
for the queues a worker's transport options lay out differently (``global_keyprefix``,
``priority_steps``, ``sep``), which they read, and for ``rollback``.

Every command opens a queue as belayq's registry records it (its lists, its lease, its
limits), and writes nothing there; a queue no belayq process has recorded is opened in the
layout the transport options give (``-o global_keyprefix=...``), as a worker with the same
URL and options would lay it out::

    python -m belayq_kombu stats        --url belayq://host:6379/0 --queue celery
    python -m belayq_kombu dead-letters --url ... --queue celery [--limit 20]
    python -m belayq_kombu replay       --url ... --queue celery [--limit 1000]
    python -m belayq_kombu rollback     --url ... --queue celery [--dead] [--wait 60]

``rollback`` is for going back to the stock ``redis://`` transport: stop the belayq workers
first. belayq's ready lists already are kombu's lists, so waiting messages need nothing. The
command puts the tasks whose countdown or ETA has not come (belayq keeps them in Redis, in
the queue's delayed set, which stock workers never read) back in kombu's lists at once,
where stock workers take them and hold them until their time, as they always did; it
returns what is in flight (leased by workers that are gone) to those lists as soon as the
leases run out; and with ``--dead`` it puts the dead letters back too. It exits 1 if a claim
is still leased when ``--wait`` runs out (a belayq worker is still running). Transport
options (``-o global_keyprefix=app:``, values parsed as JSON) must match the workers'
``broker_transport_options`` where they name lists (``global_keyprefix``,
``priority_steps``, ``sep``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from kombu import connection as _connection

from belayq.cli import views
from belayq.discovery import NoQueue, find, open_found

from . import register

Connection: Any = _connection.Connection  # kombu's annotations are partial

#: rollback waits this many leases, plus ROLLBACK_SLACK_S, by default: a lease that a worker
#: extended just before it stopped runs out within one lease, and a second one covers a
#: lease the sweep had not yet seen expire.
ROLLBACK_LEASES = 2
ROLLBACK_SLACK_S = 5.0


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep:
            raise SystemExit(f"-o wants name=value, got {pair!r}")
        try:
            out[name] = json.loads(raw)
        except ValueError:
            out[name] = raw
    return out


def _connect(args: argparse.Namespace) -> Any:
    register()
    url = args.url
    if url.startswith(("redis://", "rediss://")):
        return Connection(url, transport="belayq_kombu:Transport",
                          transport_options=_options(args.option))
    return Connection(url, transport_options=_options(args.option))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m belayq_kombu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("stats", "dead-letters", "replay", "rollback"):
        p = sub.add_parser(name)
        p.add_argument("--url", required=True, help="belayq://host:port/db (or redis://...)")
        p.add_argument("--queue", action="append", required=True, help="kombu queue name")
        p.add_argument("-o", "--option", action="append", default=[], help="transport option")
        if name in ("dead-letters", "replay"):
            p.add_argument("--limit", type=int, default=20 if name == "dead-letters" else 1000)
        if name == "rollback":
            p.add_argument("--dead", action="store_true", help="replay dead letters too")
            p.add_argument("--wait", type=float, default=None,
                           help="seconds to wait for leases to run out (default: twice the "
                           f"lease + {ROLLBACK_SLACK_S:g})")
    args = parser.parse_args(argv)
    with _connect(args) as conn:
        queues = {name: _recorded(conn.default_channel, name) for name in args.queue}
        if args.command == "stats":
            for name, rq in queues.items():
                print(name, json.dumps(rq.stats(), sort_keys=True))
        elif args.command == "dead-letters":
            for name, rq in queues.items():
                for row in views.dead(rq, args.limit):
                    print(json.dumps({"queue": name, **row}))
        elif args.command == "replay":
            for name, rq in queues.items():
                print(f"{name}: replayed {rq.replay_dead(limit=args.limit)}")
        else:
            return _rollback(queues, args.dead, args.wait)
    return 0


def _recorded(channel: Any, name: str) -> Any:
    """Kombu queue ``name`` as the registry records it; else as the channel lays it out.
    Written nowhere: no record, no lease keeper."""
    client = channel.core_client
    prefix = channel._core_options["prefix"]
    try:
        found = find(client, name, "kombu", prefix=prefix, namespace=channel.global_keyprefix)
    except NoQueue:
        found = None
    if found is not None and found.recorded:
        return open_found(client, found, prefix=prefix)
    return channel._new_queue_object(name, record=False, keeper=False)


def _rollback(queues: dict[str, Any], dead: bool, wait: float | None) -> int:
    promoted = {name: rq.promote_delayed() for name, rq in queues.items()}
    lease_s = max(rq.config.lease_ms for rq in queues.values()) / 1000
    default = lease_s * ROLLBACK_LEASES + ROLLBACK_SLACK_S
    deadline = time.monotonic() + (default if wait is None else wait)
    left: dict[str, int] = {}
    while True:
        for name, rq in queues.items():
            if rq.limits_known:
                rq.sweep()
            s = rq.stats()
            promoted[name] += rq.promote_delayed() if s["delayed"] else 0
            left[name] = s["in_flight"] + s["landing"]
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    status = 0
    for name, rq in queues.items():
        replayed = rq.replay_dead(limit=10**9) if dead else 0
        s = rq.stats()
        print(f"{name}: {s['ready']} ready in kombu's lists ({promoted[name]} of them tasks "
              f"whose countdown or ETA had not come), {left[name]} still leased, {replayed} "
              f"dead letters replayed, {s['dead']} dead letters kept")
        if left[name]:
            status = 1
    if status:
        print("some messages are still leased: stop every belayq worker, then run rollback "
              "again (or pass a longer --wait)", file=sys.stderr)
    return status
