"""``belayq``: see and steer belayq queues, whether belayq owns them or runs Celery's
(``belayq://``) or RQ's (``belayq_rq``) lists. ``belayq --help`` lists the commands, and
``belayq COMMAND --help`` tells what each does, with examples and its exit status
(:mod:`belayq.cli.parser`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from .. import actions, eviction, kinds, readmodel
from ..discovery import Found, NoQueue, open_found
from ..errors import CLIENT_ERROR, BelayqError, ConfigError, Errors, NotPermitted
from ..sharded import ShardedQueue
from . import views
from .control import cmd_pause, cmd_resume, cmd_upgrade
from .parser import DONE, ERROR, INTERRUPTED, NOTHING, build
from .serving import cmd_dashboard, cmd_demo, cmd_exporter
from .targets import CliError, connect, explain, found_names, open_named, redact

__all__ = ["main"]

#: The errors shown to the user (a queue that cannot be read, an unreachable server).
_SHOWN: Errors = (BelayqError, *CLIENT_ERROR)

def main(argv: Sequence[str] | None = None) -> int:
    """Run ``belayq`` with ``argv`` (default: the process's arguments); returns the exit
    status (see ``belayq --help``)."""
    parser = build()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        parser.print_help(sys.stderr)
        return ERROR
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return cmd_demo(args)
        client = connect(args.url)
        args.eviction = eviction.warning(client)  # read once per run, never kept
        if args.command in SERVING:
            _evictable(args)
        code = COMMANDS[args.command](client, args)
        if args.command not in (*SERVING, "watch"):  # each frame of watch reads it again
            _evictable(args)
        return code
    except (CliError, ConfigError) as exc:
        if isinstance(exc, (NoQueue, NotPermitted)):  # what the server holds or allows
            exc = CliError(explain(exc, args.url))
        print(f"belayq {args.command}: {exc}", file=sys.stderr)
        _evictable(args, failed=True)  # a queue that is gone may have been evicted
        return ERROR
    except _SHOWN as exc:
        print(f"belayq {args.command}: {explain(exc, args.url or 'the Redis server')}",
              file=sys.stderr)
        _evictable(args, failed=True)
        return ERROR
    except BrokenPipeError:  # the reader went away (`belayq dead ... | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return DONE
    except KeyboardInterrupt:
        return INTERRUPTED


#: The commands that serve until interrupted: the eviction line comes first.
SERVING = ("exporter", "dashboard")


def _evictable(args: argparse.Namespace, *, failed: bool = False) -> None:
    """The line that says the server may evict queue data, when it may: after the output
    (first, for a command that serves until interrupted); on stderr for ``queues``, for
    JSON output, and after an error."""
    if getattr(args, "eviction", None):
        to_stderr = failed or args.command == "queues" or getattr(args, "json", False)
        print(args.eviction, file=sys.stderr if to_stderr else sys.stdout, flush=True)


def _say(args: argparse.Namespace, *lines: str | None) -> None:
    """Lines for people: on stdout, or on stderr when stdout carries ``--json``."""
    for line in lines:
        if line:
            print(line, file=sys.stderr if args.json else sys.stdout)


def _emit(args: argparse.Namespace, rows: list[dict[str, Any]], columns: Sequence[str],
          empty: str, *notes: str | None) -> None:
    """``rows`` as a table (or JSON lines), ``empty`` when there are none, then ``notes``."""
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str))
    elif rows:
        print(views.table(rows, columns))
    if not rows:
        _say(args, empty)
    _say(args, *notes)


def _found(client: redis.Redis, args: argparse.Namespace) -> list[Found]:
    return found_names(client, args)


def _rows(client: redis.Redis, args: argparse.Namespace) -> list[dict[str, Any]]:
    return views.queue_rows(_found(client, args),
                            lambda f: open_found(client, f, prefix=args.prefix))


def _no_queues(args: argparse.Namespace) -> str:
    kinds = "" if args.kind == "auto" else f" of kind {args.kind}"
    return (f"no queues{kinds} known on {redact(args.url)}: a queue is listed once a belayq "
            f"process opens it (registry {args.prefix}:queues), or when RQ (rq:queues) or "
            "Celery's bindings name it")


def cmd_queues(client: redis.Redis, args: argparse.Namespace) -> int:
    rows = _rows(client, args)
    _emit(args, rows, views.queue_columns(rows), _no_queues(args))
    return DONE


def cmd_stats(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)
    raw, counts = readmodel.read_stats(q)  # the numbers every tool shows, and the counters
    counts.pop("paused")  # shown as the stats say it: 1 and paused_since_ms, or 0
    stats: dict[str, Any] = {
        "kind": found.kind, "queue": found.name, **raw, **counts,
        "ready_by_priority": dict(zip(map(str, q.config.priority_steps), q.ready_by_level(),
                                      strict=True))}
    if isinstance(q, ShardedQueue):
        stats["by_shard"] = {name: {k: s.get(k, 0) for k in views.SHARD_COLUMNS}
                             for name, s in q.shard_stats().items()}
    settings = views.settings(found)
    if args.json:
        print(json.dumps({**stats, "settings": settings}))
        return DONE
    stats.pop("leased", None)  # in_flight's older name, kept in JSON
    stats["ready_by_priority"] = " ".join(f"{k}={v}" for k, v in
                                          stats["ready_by_priority"].items())
    shards = stats.pop("by_shard", {})
    for name, value in stats.items():
        print(f"{name:22} {value}")
    for name, figures in shards.items():
        print(f"{'shard ' + name:22} " + " ".join(f"{k}={v}" for k, v in figures.items()))
    if settings is None:
        print(f"{'settings':22} not recorded: {views.unrecorded(found)}")
        return DONE
    history, ttl = settings.pop("history_max"), settings.pop("history_ttl_ms")
    events = settings.pop("events")
    for name, value in settings.items():
        print(f"{name:22} {value}")
    print(f"{'history':22} " + (
        "not recorded" if history is None else "off (history_max 0)" if not history else
        f"the last {history} of each outcome, for {views.duration(ttl or 0)} after the latest"))
    print(f"{'events':22} " + ("not recorded" if events is None else
                               "on" if events else "off"))
    return DONE


def cmd_inspect(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = open_named(client, args)
    _emit(args, views.in_flight(q, args.limit),
          ("id", "lease_left_s", "running_for_s", "deliveries", "attempts", "started",
           "held_by", "task", "task_id", "payload"), f"no message of {q.name} is claimed now")
    return DONE


def cmd_delayed(client: redis.Redis, args: argparse.Namespace) -> int:
    _, q = open_named(client, args)
    _emit(args, views.delayed(q, args.limit),
          ("id", "due_in_s", "task", "task_id", "held_by", "payload"),
          f"no delayed message in {q.name}")
    return DONE


def cmd_dead(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)
    rows = views.dead(q, args.limit)
    if not args.json:
        rows = [{**r, "dead_at": views.when(r["dead_at_ms"])} for r in rows]
    _emit(args, rows, ("id", "reason", "deliveries", "attempts", "dead_at", "task", "payload"),
          f"no dead letters in {q.name}", views.dead_note(found, len(rows), q.stats()["dead"]))
    return DONE


def cmd_history(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)
    if args.control:
        control = q.history("control", args.limit)
        rows: list[dict[str, Any]] = [
            {"action": h.outcome, "by": h.reason, "at_ms": h.finished_ms} for h in control]
        if not args.json:
            rows = [{**r, "at": views.when(h.finished_ms)} for r, h in
                    zip(rows, control, strict=True)]
        _emit(args, rows, ("action", "by", "at"),
              f"no pause or resume in the history of {q.name}",
              views.history_note(found, len(rows)))
        return DONE
    outcome = "failed" if args.failed else "done"
    rows = [{"id": h.id, "result": h.result, "reason": h.reason, "deliveries": h.deliveries,
             "attempts": h.attempts, "finished_ms": h.finished_ms, **views.describe(h.payload)}
            for h in q.history(outcome, args.limit)]
    if not args.json:
        rows = [{**r, "finished": views.when(r["finished_ms"])} for r in rows]
    what = "dead-lettered" if args.failed else "acked"
    _emit(args, rows, ("id", "reason" if args.failed else "result", "deliveries", "attempts",
                       "finished", "task", "payload"),
          f"no {what} message in the history of {q.name}",
          views.history_note(found, len(rows)),
          views.deliver_note(found) if args.failed else None)
    return DONE


def cmd_replay(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)
    missing: list[str] = []
    dead_now = q.stats()["dead"]
    if args.id:
        asked = list(dict.fromkeys(args.id))
        present = views.dead_ids(q, asked)
        missing = [i for i in asked if i not in present]
        ids = [i for i in asked if i in present]
        replayed = actions.replay_dead(q, ids, on_batch=_done_of)
    elif args.reason:
        ids = [d.id for d in q.dead_letters(max(1, dead_now)) if args.reason in d.reason]
        if not ids:
            print(f"no dead letter of {q.name} has a reason holding {args.reason!r}: nothing "
                  "replayed", file=sys.stderr)
            return NOTHING
        replayed = actions.replay_dead(q, ids, on_batch=_done_of)
    else:
        replayed = actions.replay_dead(q, None, on_batch=_done_of)
    if args.json:
        print(json.dumps({"queue": q.name, "kind": found.kind, "replayed": replayed,
                          "not_dead": missing}))
    elif replayed or not args.all:
        print(f"replayed {replayed} dead letter(s) of {q.name}")
    else:
        print(f"no dead letters in {q.name}: nothing to replay")
    if missing:
        print(f"not a dead letter of {q.name}: {', '.join(missing)} (`belayq dead` lists "
              "them)", file=sys.stderr)
        return NOTHING
    return DONE


def _done_of(done: int, total: int) -> None:
    """The progress of an action run in several batches."""
    if total > actions.BATCH:
        print(f"  {done}/{total}", file=sys.stderr)


def _confirmed(args: argparse.Namespace, what: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(f"{what}: pass --yes to confirm (no terminal to ask on)")
    try:
        answer = input(f"{what}. Type the queue name to confirm: ")
    except EOFError:
        return False
    return bool(answer.strip() == str(args.queue))


def cmd_purge(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)
    itself = kinds.can_purge_itself(found.kind)
    if found.kind in kinds.FRAMEWORK_PURGE and not itself:
        kinds.purge(q, delayed=args.delayed)  # refused, with what to install
    waiting = q.stats()
    count = waiting["ready"] + (waiting["delayed"] if args.delayed else 0)
    what = (f"{count} waiting (ready and delayed)" if args.delayed else f"{count} ready")
    asked = count or itself  # an RQ queue's scheduled jobs are not counted here
    if asked and not _confirmed(args, f"delete the {what} message(s) of {q.name}"):
        print("not confirmed: nothing deleted", file=sys.stderr)
        return NOTHING
    counts = (kinds.purge(q, delayed=args.delayed, on_batch=_progress) if asked
              else {"ready": 0, "delayed": 0})
    if args.json:
        print(json.dumps({"queue": q.name, "kind": found.kind, **counts}))
        return DONE
    print(f"purged {q.name}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in
                                           counts.items()))
    if not args.delayed and waiting["delayed"]:
        print(f"kept {waiting['delayed']} delayed message(s): `belayq purge --delayed` "
              "deletes them too")
    return DONE


def _progress(done: int) -> None:
    print(f"  {done} purged...", file=sys.stderr)


def cmd_drop(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)
    if not _confirmed(args, f"delete queue {q.name} and every key of its own"):
        print("not confirmed: nothing deleted", file=sys.stderr)
        return NOTHING
    if not bool(q.drop()):
        raise CliError(f"{q.name} has {q.stats()['in_flight']} message(s) claimed, so nothing "
                       "was deleted: shut its consumers down (`belayq inspect` shows the "
                       "claims), then drop it")
    if args.json:
        print(json.dumps({"queue": q.name, "kind": found.kind, "dropped": True}))
    else:
        print(f"dropped {q.name}")
    return DONE


def cmd_watch(client: redis.Redis, args: argparse.Namespace) -> int:
    shown = 0
    while True:
        rows = _rows(client, args)
        note = eviction.warning(client) if shown else args.eviction
        if args.json:
            print(json.dumps({"time": time.time(), "queues": rows, "eviction": note}),
                  flush=True)
        else:
            if sys.stdout.isatty():
                print("\033[2J\033[H", end="")
            print(time.strftime("%H:%M:%S"), f"every {args.interval:g} s (Ctrl-C to end)")
            print(views.table(rows, views.queue_columns(rows)) if rows else _no_queues(args))
            if note:
                print(note)
            sys.stdout.flush()
        shown += 1
        if args.count and shown >= args.count:
            return DONE
        time.sleep(args.interval)


COMMANDS: dict[str, Callable[[redis.Redis, argparse.Namespace], int]] = {
    "queues": cmd_queues, "stats": cmd_stats, "inspect": cmd_inspect,
    "delayed": cmd_delayed, "dead": cmd_dead, "history": cmd_history, "replay": cmd_replay,
    "purge": cmd_purge, "drop": cmd_drop, "pause": cmd_pause, "resume": cmd_resume,
    "watch": cmd_watch, "exporter": cmd_exporter,
    "upgrade": cmd_upgrade, "dashboard": cmd_dashboard,
}  # fmt: skip
