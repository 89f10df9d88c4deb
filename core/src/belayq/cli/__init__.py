"""``belayq``: see and steer belayq queues, whether belayq owns them or adopted Celery's
(``belayq://``) or RQ's (``belayq_rq``) lists.

    belayq queues   --url redis://host:6379/0
    belayq stats    --url ... QUEUE [--kind belayq|kombu|rq]
    belayq inspect  --url ... QUEUE [--limit 50]     claims held: lease left, runs, holder
    belayq delayed  --url ... QUEUE [--limit 50]     waiting for their due time
    belayq dead     --url ... QUEUE [--limit 50]     dead letters with their reasons
    belayq history  --url ... QUEUE [--failed]       the last finished (history_max)
    belayq replay   --url ... QUEUE (--all | --id ID ... | --reason TEXT)
    belayq purge    --url ... QUEUE [--delayed] [--yes]   delete the ready messages
    belayq drop     --url ... QUEUE [--yes]          delete the queue (refused while claimed)
    belayq watch    --url ... [QUEUE ...] [--interval 1]
    belayq exporter --url ... [QUEUE ...] [--port 9808]   Prometheus metrics
    belayq dashboard --url ... [QUEUE ...] [--port 8790] [--host H --token T]   the page
    belayq demo --web [--url ... | --redis-host H --redis-port P] [--visibility-ms 5000]
    belayq upgrade  --url ... QUEUE [--kind kombu|rq]     schema 1 -> 2

A queue is one that belayq's registry, RQ (``rq:queues``) or kombu's bindings know, found
by name (``--kind`` says which kind when a name is taken by several) or listed; nothing is
ever found by scanning the keyspace, and no other key is taken for a queue. Every tool acts
on a queue with its recorded configuration. ``--json`` prints machine-readable output. A bad
URL or an unknown queue is a one-line error and exit status 2; passwords are never printed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from ..discovery import KNOWN_KINDS, Found, find, layout_of, list_queues, open_found
from ..errors import CLIENT_ERROR, BelayqError, ConfigError, Errors
from ..kinds import tools_for
from ..sharded import AnyQueue, ShardedQueue
from . import views
from .targets import CliError, connect, kind_filter, redact

#: The errors shown to the user (a queue that cannot be read, an unreachable server).
_SHOWN: Errors = (BelayqError, *CLIENT_ERROR)

#: Replays and purges run in batches of this many, printing their progress.
BATCH = 1000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="belayq", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = ("stats", "inspect", "delayed", "dead", "history", "replay", "purge", "drop",
           "upgrade")
    for name in ("queues", *one, "watch", "exporter"):
        p = sub.add_parser(name)
        p.add_argument("--url", required=True, help="redis://, rediss://, unix://, belayq://")
        p.add_argument("--kind", choices=("auto", *KNOWN_KINDS), default="auto",
                       help="the kind of queue: belayq's own, Celery's (kombu) or RQ's")
        p.add_argument("--prefix", default="belayq", help="the key prefix of belayq's queues "
                       "and registry")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name in one:
            p.add_argument("queue")
        if name in ("watch", "exporter"):
            p.add_argument("queue", nargs="*", help="default: every queue found")
        if name in ("inspect", "delayed", "dead", "history"):
            p.add_argument("--limit", type=int, default=50)
        if name == "history":
            p.add_argument("--failed", action="store_true", help="dead-lettered ones")
        if name == "replay":
            what = p.add_mutually_exclusive_group(required=True)
            what.add_argument("--all", action="store_true")
            what.add_argument("--id", action="append", help="a dead letter's id (repeatable)")
            what.add_argument("--reason", help="dead letters whose reason holds this text")
        if name in ("purge", "drop"):
            p.add_argument("--yes", action="store_true", help="do not ask")
        if name == "purge":
            p.add_argument("--delayed", action="store_true", help="delete the delayed "
                           "messages too (countdowns, ETAs, retry backoffs; RQ's scheduled "
                           "jobs): kept by default, as a running stock fleet keeps them")
        if name == "watch":
            p.add_argument("--interval", type=float, default=1.0)
            p.add_argument("--count", type=int, default=0, help="stop after N views (0: never)")
        if name == "exporter":
            p.add_argument("--port", type=int, default=9808)
            p.add_argument("--host", default="127.0.0.1")
    board = sub.add_parser("dashboard", help="serve the dashboard page")
    board.add_argument("--url", required=True)
    board.add_argument("--kind", choices=("auto", *KNOWN_KINDS), default="auto")
    board.add_argument("--prefix", default="belayq")
    board.add_argument("queue", nargs="*", help="default: every queue found")
    demo = sub.add_parser("demo", help="the job-queue demo with its worker pool")
    demo.add_argument("--web", action="store_true", required=True,
                      help="serve the demo page (the terminal demo is examples/demo.py)")
    demo.add_argument("--url", help="default: an embedded Redis started for the demo")
    demo.add_argument("--redis-host", help="with --redis-port: redis://HOST:PORT/0")
    demo.add_argument("--redis-port", type=int)
    demo.add_argument("--visibility-ms", type=int, default=5000, help="the lease (ms)")
    demo.add_argument("--queue", default="demo-jobs")
    for p in (board, demo):
        p.add_argument("--host", default="127.0.0.1",
                       help="a non-loopback address needs --token")
        p.add_argument("--port", type=int, default=8790 if p is board else 8793)
        p.add_argument("--token", default=os.environ.get("BELAYQ_TOKEN"),
                       help="required of every API request (default: $BELAYQ_TOKEN)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return cmd_demo(args)
        client = connect(args.url)
        return COMMANDS[args.command](client, args)
    except (CliError, ConfigError) as exc:
        print(f"belayq {args.command}: {exc}", file=sys.stderr)
        return 2
    except _SHOWN as exc:
        print(f"belayq {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _queue(client: redis.Redis, args: argparse.Namespace) -> tuple[Found, AnyQueue]:
    found = find(client, args.queue, args.kind, prefix=args.prefix)
    return found, open_found(client, found, prefix=args.prefix)


def _emit(args: argparse.Namespace, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str))
    else:
        print(views.table(rows, columns) if rows else "(none)")


def _found(client: redis.Redis, args: argparse.Namespace) -> list[Found]:
    names = getattr(args, "queue", None) or []
    return ([find(client, n, args.kind, prefix=args.prefix) for n in names]
            or list_queues(client, args.prefix, kind_filter(args.kind)))


def _rows(client: redis.Redis, args: argparse.Namespace) -> list[dict[str, Any]]:
    return views.queue_rows(_found(client, args),
                            lambda f: open_found(client, f, prefix=args.prefix))


def cmd_queues(client: redis.Redis, args: argparse.Namespace) -> int:
    rows = _rows(client, args)
    _emit(args, rows, views.queue_columns(rows))
    return 0


def cmd_stats(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = _queue(client, args)
    stats: dict[str, Any] = {
        "kind": found.kind, "queue": found.name, **q.stats(),
        "ready_by_priority": dict(zip(map(str, q.config.priority_steps), q.ready_by_level(),
                                      strict=True))}
    if isinstance(q, ShardedQueue):
        stats["by_shard"] = {name: {k: s.get(k, 0) for k in views.SHARD_COLUMNS}
                             for name, s in q.shard_stats().items()}
    if args.json:
        print(json.dumps(stats))
    else:
        for name, value in stats.items():
            print(f"{name:22} {value}")
    return 0


def cmd_inspect(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = _queue(client, args)
    _emit(args, views.in_flight(q, args.limit),
          ("id", "lease_left_s", "deliveries", "attempts", "started", "task", "task_id",
           "payload"))
    return 0


def cmd_delayed(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = _queue(client, args)
    _emit(args, views.delayed(q, args.limit),
          ("id", "due_in_s", "task", "task_id", "held_by", "payload"))
    return 0


def cmd_dead(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = _queue(client, args)
    _emit(args, views.dead(q, args.limit),
          ("id", "reason", "deliveries", "attempts", "task", "payload"))
    return 0


def cmd_history(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = _queue(client, args)
    rows = [{"id": h.id, "result": h.result, "reason": h.reason, "deliveries": h.deliveries,
             "attempts": h.attempts, "finished_ms": h.finished_ms, **views.describe(h.payload)}
            for h in q.history("failed" if args.failed else "done", args.limit)]
    _emit(args, rows, ("id", "reason" if args.failed else "result", "deliveries", "attempts",
                       "finished_ms", "task", "payload"))
    return 0


def cmd_replay(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = _queue(client, args)
    if args.id:
        replayed = q.replay_dead(args.id)
    elif args.reason:
        ids = [d.id for d in q.dead_letters(q.config.dead_letter_max)
               if args.reason in d.reason]
        replayed = _batched(lambda chunk: q.replay_dead(chunk), ids)
    else:
        replayed = _batched(lambda chunk: q.replay_dead(limit=len(chunk)),
                            [""] * q.stats()["dead"])
    print(f"replayed {replayed} dead letter(s) of {q.name}")
    return 0


def _batched(step: Callable[[list[str]], int], items: list[str]) -> int:
    """Run ``step`` on ``items`` in batches, printing progress when there are several."""
    done = 0
    for start in range(0, len(items), BATCH):
        done += step(items[start : start + BATCH])
        if len(items) > BATCH:
            print(f"  {min(start + BATCH, len(items))}/{len(items)}", file=sys.stderr)
    return done


def _confirmed(args: argparse.Namespace, what: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(f"{what}: pass --yes to confirm (no terminal to ask on)")
    answer = input(f"{what}. Type the queue name to confirm: ")
    return bool(answer.strip() == str(args.queue))


def cmd_purge(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = _queue(client, args)
    tools = tools_for(found.kind)
    if found.kind in FRAMEWORK_PURGE and tools is None:
        raise CliError(f"purging a queue of kind {found.kind} deletes what its framework keeps "
                       f"beside it ({FRAMEWORK_PURGE[found.kind]}): install its adapter "
                       f"(pip install belayq-{found.kind}) to purge it")
    waiting = q.stats()
    what = (f"{waiting['ready'] + waiting['delayed']} waiting (ready and delayed)"
            if args.delayed else f"{waiting['ready']} ready")
    if not _confirmed(args, f"delete the {what} message(s) of {q.name}"):
        print("not confirmed: nothing deleted", file=sys.stderr)
        return 1
    if tools is not None:
        counts = tools.purge(q, delayed=args.delayed)
    else:
        purged = q.purge(on_batch=_progress, delayed=args.delayed)
        counts = {"ready": purged.ready, "delayed": purged.delayed}
    if args.json:
        print(json.dumps({"queue": q.name, "kind": found.kind, **counts}))
        return 0
    print(f"purged {q.name}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in
                                           counts.items()))
    if not args.delayed and waiting["delayed"]:
        print(f"kept {waiting['delayed']} delayed message(s): `belayq purge --delayed` "
              "deletes them too")
    return 0


#: Kinds whose framework keeps a record per message beside the list: their purge needs the
#: adapter (:mod:`belayq.kinds`).
FRAMEWORK_PURGE = {"rq": "the job hashes, as `rq empty` does"}


def _progress(done: int) -> None:
    print(f"  {done} purged...", file=sys.stderr)


def cmd_drop(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = _queue(client, args)
    if not _confirmed(args, f"delete queue {q.name} and every key of its own"):
        print("not confirmed: nothing deleted", file=sys.stderr)
        return 1
    if not bool(q.drop()):
        raise CliError(f"{q.name} has messages claimed: stop its consumers first")
    print(f"dropped {q.name}")
    return 0


def cmd_watch(client: redis.Redis, args: argparse.Namespace) -> int:
    shown = 0
    while True:
        rows = _rows(client, args)
        if sys.stdout.isatty():
            print("\033[2J\033[H", end="")
        print(time.strftime("%H:%M:%S"), "every", args.interval, "s (Ctrl-C to stop)")
        print(views.table(rows, views.queue_columns(rows)) if rows else "(no queues)",
              flush=True)
        shown += 1
        if args.count and shown >= args.count:
            return 0
        time.sleep(args.interval)


def cmd_exporter(client: redis.Redis, args: argparse.Namespace) -> int:
    try:
        from prometheus_client import REGISTRY, start_http_server
    except ImportError:
        raise CliError("the exporter needs prometheus_client: pip install belayq[metrics]") \
            from None
    from ..metrics import QueueCollector

    def openers() -> list[Callable[[], AnyQueue]]:
        return [functools.partial(open_found, client, f, prefix=args.prefix)
                for f in _found(client, args)]

    REGISTRY.register(QueueCollector(openers))
    start_http_server(args.port, addr=args.host)
    print(f"belayq exporter on http://{args.host}:{args.port}/metrics", flush=True)
    while True:
        time.sleep(3600)


def _web() -> Any:
    try:
        from .. import web
    except ImportError:
        raise CliError("the dashboard needs Starlette and uvicorn: pip install belayq[web]") \
            from None
    return web


def cmd_dashboard(client: redis.Redis, args: argparse.Namespace) -> int:
    web = _web()
    app = web.create_app(client, queues=args.queue, kind=args.kind, prefix=args.prefix,
                         token=args.token, host=args.host)
    print(f"belayq dashboard on http://{args.host}:{args.port}/", flush=True)
    web.serve(app, args.host, args.port)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The seed's demo page: a queue with history and events on, and a worker pool."""
    web = _web()
    from ..embedded import RedisServer, stop_on_sigterm
    from .demo_mode import demo_pool

    server = pool = None
    url = args.url
    if url is None and args.redis_host:
        url = f"redis://{args.redis_host}:{args.redis_port or 6379}/0"
    # A SIGTERM (kill, a service manager) stops the demo through the finally below, and
    # with it the redis-server it started (which also stops if the demo is SIGKILLed).
    stop_on_sigterm()
    try:
        if url is None:
            server = RedisServer().start()
            url = server.url
        client = connect(url)
        pool = demo_pool(client, args.queue, args.visibility_ms)
        app = web.create_app(client, demo=pool, token=args.token, host=args.host)
        print(f"belayq demo on http://{args.host}:{args.port}/ (Redis at {redact(url)}, "
              f"visibility {args.visibility_ms} ms)", flush=True)
        web.serve(app, args.host, args.port)
    finally:
        if pool is not None:
            pool.stop()
        if server is not None:
            server.stop()
    return 0


def cmd_upgrade(client: redis.Redis, args: argparse.Namespace) -> int:
    from ..upgrade import upgrade_schema1

    kind = "belayq" if args.kind == "auto" else args.kind
    # Schema 1 named its level lists the same way.
    keys = {k: v for k, v in layout_of(kind, args.queue, prefix=args.prefix).items()
            if k not in ("priority_steps", "kind")}
    counts = upgrade_schema1(client, args.queue, **keys)
    print(f"queue {args.queue!r} is at schema 2: {counts['returned']} claim(s) put back, "
          f"{counts['messages']} message record(s) rewritten, {counts['dead']} dead letter(s)")
    return 0


COMMANDS: dict[str, Callable[[redis.Redis, argparse.Namespace], int]] = {
    "queues": cmd_queues, "stats": cmd_stats, "inspect": cmd_inspect,
    "delayed": cmd_delayed, "dead": cmd_dead, "history": cmd_history, "replay": cmd_replay,
    "purge": cmd_purge, "drop": cmd_drop, "watch": cmd_watch, "exporter": cmd_exporter,
    "upgrade": cmd_upgrade,
    "dashboard": cmd_dashboard,
}  # fmt: skip
