"""``python -m belayq upgrade``: upgrade a schema-1 queue in place (see belayq.upgrade)."""

from __future__ import annotations

import argparse
import sys

import redis

from .errors import BelayqError
from .upgrade import upgrade_schema1

_KOMBU_SEP = "\x06\x16"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m belayq")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upgrade", help="rewrite a schema-1 queue as schema 2 (stop its "
                        "consumers first)")
    up.add_argument("--url", required=True, help="redis://host:port/db of the queue")
    up.add_argument("--queue", required=True, help="the queue name")
    kind = up.add_mutually_exclusive_group()
    kind.add_argument("--kombu", action="store_true",
                      help="a belayq:// (Celery) queue: kombu's lists, priority steps 0,3,6,9")
    kind.add_argument("--rq", action="store_true", help="a belayq_rq queue (rq:queue:NAME)")
    up.add_argument("--prefix", default="belayq", help="the prefix of an owned queue")
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(args.url)
    layout: dict[str, object] = {"prefix": args.prefix}
    if args.kombu:
        layout.update(ready_key=args.queue, payload_in_list=True,
                      level_keys=[f"{args.queue}{_KOMBU_SEP}{s}" for s in (3, 6, 9)])
    elif args.rq:
        layout.update(ready_key=f"rq:queue:{args.queue}", payload_in_list=True,
                      ready_head="left")
    try:
        counts = upgrade_schema1(client, args.queue, **layout)  # type: ignore[arg-type]
    except (BelayqError, redis.RedisError) as exc:
        print(f"belayq upgrade: {exc}", file=sys.stderr)
        return 2
    print(f"queue {args.queue!r} is at schema 2: {counts['returned']} claim(s) put back, "
          f"{counts['messages']} message record(s) rewritten, {counts['dead']} dead letter(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
