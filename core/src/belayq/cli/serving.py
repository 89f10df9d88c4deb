"""The commands that serve until interrupted: the Prometheus exporter, the dashboard and the
web demo."""

from __future__ import annotations

import argparse
import functools
import socket
import time
from collections.abc import Callable
from typing import Any

import redis

from ..discovery import open_found
from ..sharded import AnyQueue
from .parser import INTERRUPTED
from .targets import CliError, connect, found_names, redact


def _listen_check(host: str, port: int) -> None:
    """Refuse at once a host and port this process cannot listen on."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def cmd_exporter(client: redis.Redis, args: argparse.Namespace) -> int:
    try:
        from prometheus_client import REGISTRY, start_http_server
    except ImportError:
        raise CliError("the exporter needs prometheus_client: pip install belayq[metrics]") \
            from None
    from ..metrics import QueueCollector

    found_names(client, args)  # an unknown queue is an error now, not at the first scrape
    _listen_check(args.host, args.port)
    REGISTRY.register(QueueCollector(functools.partial(queue_openers, client, args),
                                     client=client))
    start_http_server(args.port, addr=args.host)
    print(f"belayq exporter on http://{args.host}:{args.port}/metrics", flush=True)
    while True:
        time.sleep(3600)


def queue_openers(client: redis.Redis, args: argparse.Namespace) -> list[Callable[[], AnyQueue]]:
    """The exporter's queues for one scrape: found again, and each opened as its record
    stands at that scrape (the exporter runs for months; a rolling restart's new limits
    apply from its next scrape)."""
    return [functools.partial(open_found, client, f, prefix=args.prefix)
            for f in found_names(client, args)]


def _web() -> Any:
    try:
        from .. import web
    except ImportError:
        raise CliError("the dashboard needs Starlette and uvicorn: pip install belayq[web]") \
            from None
    return web


def cmd_dashboard(client: redis.Redis, args: argparse.Namespace) -> int:
    web = _web()
    found_names(client, args)
    app = web.create_app(client, queues=args.queue, kind=args.kind, prefix=args.prefix,
                         token=args.token, host=args.host)
    _listen_check(args.host, args.port)
    print(f"belayq dashboard on http://{args.host}:{args.port}/", flush=True)
    web.serve(app, args.host, args.port)  # returns once Ctrl-C ended it
    return INTERRUPTED


def cmd_demo(args: argparse.Namespace) -> int:
    """The demo page: a queue with history and events on, and a worker pool."""
    web = _web()
    from ..embedded import RedisServer, stop_on_sigterm
    from .demo_mode import demo_pool

    if args.url is not None and (args.redis_host or args.redis_port):
        raise CliError("give --url, or --redis-host and --redis-port, not both")
    server = pool = None
    url = args.url
    if args.redis_host or args.redis_port:
        url = f"redis://{args.redis_host or '127.0.0.1'}:{args.redis_port or 6379}/0"
    _listen_check(args.host, args.port)
    # A SIGTERM (kill, a service manager) ends the demo through the finally below, and
    # with it the redis-server it started (which also ends if the demo is SIGKILLed).
    stop_on_sigterm()
    try:
        if url is None:
            server = RedisServer().start()
            url = server.url
        args.url = url
        client = connect(url)
        pool = demo_pool(client, args.queue, args.visibility_ms)
        app = web.create_app(client, demo=pool, token=args.token, host=args.host)
        print(f"belayq demo on http://{args.host}:{args.port}/ (Redis at {redact(url)}, "
              f"visibility {args.visibility_ms} ms)", flush=True)
        web.serve(app, args.host, args.port)  # returns once Ctrl-C ended it
    finally:
        if pool is not None:
            pool.stop()
        if server is not None:
            server.stop()
    return INTERRUPTED
