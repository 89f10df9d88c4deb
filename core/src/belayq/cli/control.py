"""The commands that steer a queue's consumers or its keys' schema: ``belayq pause``,
``belayq resume`` and ``belayq upgrade``."""

from __future__ import annotations

import argparse
import json
import os
import socket

import redis

from ..discovery import layout_of
from ..keys import SCHEMA_VERSION, QueueKeys
from ..models import text as _text
from .parser import DONE
from .targets import CliError, open_named


def cmd_pause(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)  # recorded in its history, as its own are
    changed = q.pause(_by())
    if args.json:
        print(json.dumps({"queue": q.name, "kind": found.kind, "paused": True,
                          "changed": changed}))
    elif changed:
        print(f"paused {q.name}: its consumers are handed nothing until `belayq resume`; "
              "publishing goes on, and the claims held now are extended and settled as usual")
    else:
        print(f"{q.name} was paused already: nothing changed")
    return DONE


def cmd_resume(client: redis.Redis, args: argparse.Namespace) -> int:
    found, q = open_named(client, args)
    changed = q.resume(_by())
    if args.json:
        print(json.dumps({"queue": q.name, "kind": found.kind, "paused": False,
                          "changed": changed}))
    elif changed:
        print(f"resumed {q.name}: its consumers claim again")
    else:
        print(f"{q.name} was not paused: nothing changed")
    return DONE


def _by() -> str:
    """Who pauses or resumes, for the queue's record: the user, host and pid of this CLI."""
    user = "".join(c for c in os.environ.get("USER", "") if c.isprintable())[:40]
    return (f"{user}@" if user else "") + f"{socket.gethostname()[:100]}:{os.getpid()} (cli)"


def cmd_upgrade(client: redis.Redis, args: argparse.Namespace) -> int:
    from ..upgrade import upgrade_schema1

    kind = "belayq" if args.kind == "auto" else args.kind
    # Schema 1 named its keys as schema 2 does: the layout says where they are.
    layout = {k: v for k, v in layout_of(kind, args.queue, prefix=args.prefix).items()
              if k not in ("priority_steps", "kind")}
    levels = list(layout.get("level_keys") or ())
    stats_key = QueueKeys.build(args.queue, prefix=layout.get("prefix", args.prefix),
                                steps=1 + len(levels), ready_key=layout.get("ready_key"),
                                level_keys=levels).stats
    schema = client.hget(stats_key, "schema")
    if schema is None:
        raise CliError(f"no queue {args.queue!r} of kind {kind} is here ({stats_key!r} does not "
                       "exist; --kind names another kind)")
    if int(schema) == SCHEMA_VERSION:
        if args.json:
            print(json.dumps({"queue": args.queue, "kind": kind, "schema": SCHEMA_VERSION,
                              "upgraded": False}))
        else:
            print(f"queue {args.queue!r} is already at schema {SCHEMA_VERSION}: nothing to do")
        return DONE
    if int(schema) != 1:
        raise CliError(f"queue {args.queue!r} is at key schema {_text(schema)}, which this "
                       f"belayq cannot upgrade (it upgrades 1 to {SCHEMA_VERSION})")
    counts = upgrade_schema1(client, args.queue, **layout)
    if args.json:
        print(json.dumps({"queue": args.queue, "kind": kind, "schema": SCHEMA_VERSION,
                          "upgraded": True, **counts}))
        return DONE
    print(f"queue {args.queue!r} is at schema {SCHEMA_VERSION}: {counts['returned']} claim(s) "
          f"put back, {counts['messages']} message record(s) rewritten, {counts['dead']} dead "
          "letter(s)")
    return DONE
