"""A consumer process of the keeper tests (``python -m tests.sentinel.holder '<json>'``):
it claims one message, works on it for a while (its lease keeper extends the lease), then
acks it, and says what happened on stdout, one line per event:

* ``claimed <id> <monotonic s>``
* ``acked <True|False> <monotonic s>``, or ``error <repr>``

Its client is built as the options say: ``"readme"`` (``Sentinel(addrs).master_for(name,
socket_timeout=5)``, the sentinel connections without any timeout), ``"docs"``
(``Sentinel(addrs, socket_timeout=1.0).master_for(name, socket_timeout=5.0)``) or
``"plain"`` (``redis.Redis(port=...)``). Every connection it opens is named
``belayq-holder``, so a test can close them on the server.

Options (a JSON object): ``client``, ``sentinels`` (list of [host, port]), ``service``,
``port`` (plain), ``queue``, ``queue_options`` (ReliableQueue keyword arguments),
``work_s`` (least time it works), ``go_file`` (then it also waits until this file exists).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import redis
from redis.sentinel import Sentinel

from belayq import ReliableQueue

NAME = "belayq-holder"


def client_of(opts: dict[str, Any]) -> redis.Redis:
    kind = opts["client"]
    if kind == "plain":
        return redis.Redis(port=int(opts["port"]), socket_timeout=5, client_name=NAME)
    addrs = [tuple(a) for a in opts["sentinels"]]
    if kind == "readme":
        sentinel = Sentinel(addrs)
    elif kind == "docs":
        sentinel = Sentinel(addrs, socket_timeout=1.0)
    else:
        raise ValueError(kind)
    client: redis.Redis = sentinel.master_for(
        opts["service"], socket_timeout=5.0, client_name=NAME
    )
    return client


def say(*words: object) -> None:
    print(*words, flush=True)


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(name)s %(message)s")
    opts = json.loads(sys.argv[1])
    client = client_of(opts)
    q = ReliableQueue(client, opts["queue"], **opts.get("queue_options", {}))
    got = []
    while not got:
        got = q.claim(timeout=1)
    [d] = got
    say("claimed", d.id, f"{time.monotonic():.6f}")
    time.sleep(float(opts["work_s"]))
    go = opts.get("go_file")
    while go and not os.path.exists(go):
        time.sleep(0.05)
    try:
        ok = q.ack(d)
    except Exception as exc:  # reported to the test, which fails on it
        say("error", repr(exc))
        return
    say("acked", ok, f"{time.monotonic():.6f}")


if __name__ == "__main__":
    main()
