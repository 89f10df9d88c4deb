"""The dashboard's web app (Starlette): the page, its JSON API, and the guard in front.

The API reads one queue's lists O(shown), never O(queue), so the page's refresh (every second) costs
a few small commands per queue. It can replay, sweep and purge, hence the guard in front
of it (:mod:`belayq.web.guard`): bound to loopback, or behind a token.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import actions, eviction, kinds, readmodel, rollups
from ..cli import views
from ..cli.targets import CliError, kind_filter
from ..discovery import Found, find, list_queues, open_found
from ..errors import CLIENT_ERROR, BelayqError, ConfigError, ConnectionLost, Errors
from ..kinds import console_for
from ..registry import QueueRecord, Registry
from ..sharded import AnyQueue
from . import console
from .demo import DemoPool, PoolSettings
from .guard import Guard, is_loopback

#: The errors shown to the user (a queue that cannot be read, an unreachable server).
_SHOWN: Errors = (BelayqError, *CLIENT_ERROR)

STATIC = Path(__file__).parent / "static"
#: Rows of each list the page shows.
SHOWN = 50
#: Leases read to tell who holds what (the soonest to expire).
HOLDERS_READ = 1000
#: The most failed jobs one "all" action of the page requeues or deletes.
FAILED_AT_ONCE = 10_000
#: How long the list of queues is reused before it is looked up again (s).
FIND_EVERY_S = 5.0


class Dashboard:
    """What the API reads and does: the queues named (or every queue found), each as its
    record stands at the request."""

    def __init__(self, client: redis.Redis, *, queues: Sequence[str] = (), kind: str = "auto",
                 prefix: str = "belayq", demo: DemoPool | None = None) -> None:
        self.client = client
        self.names = list(queues)
        self.kind = kind
        self.prefix = prefix
        self.demo = demo
        self._open: dict[tuple[str, str, str], tuple[Found, AnyQueue]] = {}
        self._found: tuple[float, list[Found]] | None = None
        self.rates = readmodel.Rates()

    def found(self) -> list[Found]:
        """The queues shown, looked up again at most every ``FIND_EVERY_S``."""
        if self.demo is not None:
            return [Found("belayq", self.demo.name, self.demo.producer.record())]
        now = time.monotonic()
        if self._found is None or now - self._found[0] > FIND_EVERY_S:
            if self.names:
                found = [find(self.client, n, self.kind, prefix=self.prefix)
                         for n in self.names]
            else:
                found = list_queues(self.client, self.prefix, kind_filter(self.kind))
            self._found = (now, found)
        return self._found[1]

    def queue(self, kind: str, name: str,
              records: Mapping[tuple[str, str, str], QueueRecord] | None = None,
              namespace: str = "") -> tuple[Found, AnyQueue]:
        """The queue ``name`` of ``kind`` among those shown, as its record stands now (read
        again, or taken from ``records``, read once for a whole page): the queue is opened
        again whenever its record changed, so every request applies the limits, the bell,
        the history and the events recorded at that moment. ``namespace``: of an app that
        shares the server with another (Dramatiq's namespace, Celery's global_keyprefix).

        Raises:
            LookupError: No such queue is shown.
        """
        key = (kind, name, namespace)
        hit = next((f for f in self.found() if (f.kind, f.name, f.namespace) == key), None)
        if hit is None:
            self._found = None  # perhaps created since the last look
            hit = next((f for f in self.found() if (f.kind, f.name, f.namespace) == key), None)
        if hit is None:
            where = f" in namespace {namespace!r}" if namespace else ""
            raise LookupError(f"no queue {name!r} of kind {kind}{where} here")
        if self.demo is not None:
            return hit, self.demo.producer
        now = (records.get(key) if records is not None
               else Registry(self.client, self.prefix).get(kind, name, namespace))
        hit = dataclasses.replace(hit, record=now)
        held = self._open.get(key)
        if held is None or held[0] != hit:
            held = self._open[key] = (hit, open_found(self.client, hit, prefix=self.prefix))
        return held

    def records(self) -> dict[tuple[str, str, str], QueueRecord] | None:
        """Every queue's record as it stands now: one read of the registry for a page."""
        if self.demo is not None:
            return None
        return {(r.kind, r.name, r.namespace): r
                for r in Registry(self.client, self.prefix).all()}

    def overview(self) -> dict[str, Any]:
        items, rows = [], []
        records = self.records()
        for f in self.found():
            try:
                items.append(self.queue(f.kind, f.name, records, f.namespace))
            except ConnectionLost:
                raise
            except _SHOWN as exc:  # one that cannot be opened is a line with its error
                rows.append(views.error_row(f, exc))
        rows = console.overview_rows(items, self.rates) + rows
        return {"queues": rows, "demo": self.demo.state() if self.demo else None,
                "eviction": eviction.warning(self.client)}

    def search(self, message_id: str) -> list[dict[str, Any]]:
        records = self.records()
        return console.search([self.queue(f.kind, f.name, records, f.namespace)
                               for f in self.found()], message_id)

    def detail(self, found: Found, q: AnyQueue) -> dict[str, Any]:
        hung = set(self.demo.hung) if self.demo else set()
        in_flight = views.in_flight(q, SHOWN)
        for row in in_flight:
            row["hung"] = row["id"] in hung
        stats, counts = readmodel.read_stats(q)
        return {
            "stats": stats,
            "counts": counts,
            "ready_by_priority": dict(zip(map(str, q.config.priority_steps),
                                          q.ready_by_level(), strict=True)),
            "lease_ms": q.config.lease_ms if q.limits_known else None,
            "ready": views.ready(q, SHOWN),
            "in_flight": in_flight,
            "delayed": views.delayed(q, SHOWN),
            "dead": views.dead(q, SHOWN),
            "completed": [_record(h) for h in q.history("done", SHOWN)],
            "failed": [_record(h) for h in q.history("failed", SHOWN)],
            "history_max": q.config.history_max,  # as recorded
            "framework_failed": console.failed(q, SHOWN),
            "per_minute": rollups.history(q),
            "actions": console.actions(q, SHOWN),
            "consumers": [{"holder": h, "leases": n} for h, n in sorted(
                q.holders(HOLDERS_READ).items(), key=lambda item: -item[1])],
        }  # fmt: skip


def _record(h: Any) -> dict[str, Any]:
    return {"id": h.id, "result": h.result, "reason": h.reason, "deliveries": h.deliveries,
            "attempts": h.attempts, "finished_ms": h.finished_ms, **views.describe(h.payload)}


Handler = Callable[[Request], Awaitable[Response]]


def create_app(client: redis.Redis, *, queues: Sequence[str] = (), kind: str = "auto",
               prefix: str = "belayq", demo: DemoPool | None = None,
               token: str | None = None, host: str = "127.0.0.1") -> Starlette:
    """The dashboard as an ASGI app (serve it with any ASGI server, or :func:`serve`).
    ``queues``: names (default: every queue found). Every queue is shown and acted on with
    its recorded configuration (lease bars are drawn against its recorded lease).

    Raises:
        ConfigError: ``host`` is not a loopback address and no ``token`` is given.
    """
    if not is_loopback(host) and not token:
        raise ConfigError(f"serving the dashboard on {host} (not loopback) needs a token: "
                          "it can replay and purge")
    board = Dashboard(client, queues=queues, kind=kind, prefix=prefix, demo=demo)

    def api(fn: Callable[..., Any]) -> Handler:
        async def endpoint(request: Request) -> Response:
            from starlette.concurrency import run_in_threadpool

            body: dict[str, Any] = {}
            if request.method == "POST":
                try:
                    body = json.loads(await request.body() or b"{}")
                except ValueError:
                    return JSONResponse({"error": "the body is not JSON"}, status_code=400)
                if not isinstance(body, dict):
                    return JSONResponse({"error": "the body must be an object"},
                                        status_code=400)
            try:
                result = await run_in_threadpool(fn, request, body)
            except LookupError as exc:
                return JSONResponse({"error": str(exc.args[0])}, status_code=404)
            except (CliError, ConfigError, TypeError, ValueError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            except _SHOWN as exc:
                return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=503)
            return JSONResponse(result)

        return endpoint

    def opened(request: Request) -> tuple[Found, AnyQueue]:
        """The queue a request names (``?namespace=`` when apps share the server)."""
        return board.queue(request.path_params["kind"], request.path_params["name"],
                           namespace=request.query_params.get("namespace", ""))

    def target(request: Request) -> AnyQueue:
        return opened(request)[1]

    def overview(request: Request, body: dict[str, Any]) -> Any:
        return board.overview()

    def detail(request: Request, body: dict[str, Any]) -> Any:
        return board.detail(*opened(request))

    def done(request: Request, q: AnyQueue, action: str, result: dict[str, Any],
             **detail: Any) -> dict[str, Any]:
        """Record ``action`` in the queue's log, and answer ``result``."""
        client = request.client
        console.record(q, action, {**detail, **result},
                       by=client.host if client is not None else "unknown")
        return result

    def sweep(request: Request, body: dict[str, Any]) -> Any:
        found, q = opened(request)
        if not found.recorded:
            raise ConfigError(f"no process has recorded the limits of {found.name!r} (only "
                              "its framework knows it): its recovery pass is left to its "
                              "workers")
        r = q.sweep()
        return done(request, q, "sweep", {
            "reclaimed": r.reclaimed, "adopted": r.adopted, "promoted": r.promoted,
            "dead_lettered": r.dead_lettered})

    def chosen(q: AnyQueue, body: dict[str, Any]) -> list[str] | None:
        """The ids an action names (None: ``{"all": true}``, confirmed with the name)."""
        ids = body.get("ids")
        if ids is not None:
            if not (isinstance(ids, list) and ids and all(isinstance(i, str) and i
                                                           for i in ids)):
                raise ConfigError("ids must be a non-empty list of non-empty strings")
            return list(ids)
        if body.get("all") is not True:
            raise ConfigError('send {"ids": [...]} or {"all": true, "confirm": "<queue>"}')
        if body.get("confirm") != q.name:
            raise ConfigError(f'send {{"confirm": "{q.name}"}} to act on every one')
        return None

    def replay(request: Request, body: dict[str, Any]) -> Any:
        q = target(request)
        ids = chosen(q, body)
        n = actions.replay_dead(q, ids)  # as belayq replay does: batches of a few
        return done(request, q, "replay", {"replayed": n}, ids=ids or "all")

    def delete(request: Request, body: dict[str, Any]) -> Any:
        q = target(request)
        where = body.get("from", "dead")
        ids = chosen(q, body)
        if where == "dead":
            n = actions.delete_dead(q, ids)
        elif where == "failed":
            n = framework(q, "delete_failed", ids)
        else:
            raise ConfigError(f'"from" must be "dead" or "failed", got {where!r}')
        return done(request, q, "delete", {"deleted": n}, ids=ids or "all", where=where)

    def retry(request: Request, body: dict[str, Any]) -> Any:
        q = target(request)
        ids = chosen(q, body)
        n = framework(q, "retry_failed", ids)
        return done(request, q, "retry", {"requeued": n}, ids=ids or "all")

    def framework(q: AnyQueue, call: str, ids: list[str] | None) -> int:
        tools = console_for(q.kind)
        if tools is None:
            raise ConfigError(f"the framework of {q.name!r} ({q.kind}) keeps no failed jobs "
                              "of its own here: its failures are the dead letters")
        if not hasattr(tools, call):
            raise ConfigError(f"the failed runs of {q.name!r} ({q.kind}) are not requeued "
                              "from here: a task is retried by its own retry policy")
        if ids is None:
            ids = [row["id"] for row in tools.failed(q, FAILED_AT_ONCE)]
        return int(getattr(tools, call)(q, ids))

    def pause(request: Request, body: dict[str, Any]) -> Any:
        q = target(request)
        client = request.client
        by = f"dashboard {client.host if client is not None else 'unknown'}"
        if request.url.path.endswith("/pause"):
            return done(request, q, "pause", {"paused": q.pause(by=by)})
        return done(request, q, "resume", {"resumed": q.resume(by=by)})

    def purge(request: Request, body: dict[str, Any]) -> Any:
        q = target(request)
        if body.get("confirm") != q.name:
            raise ConfigError('send {"confirm": "<the queue name>"} to purge')
        counts = kinds.purge(q, delayed=True)  # the page's purge: ready and delayed
        purged = counts["ready"] + counts["delayed"] + counts.get("scheduled", 0)
        return done(request, q, "purge", {"purged": purged, **counts})

    def message(request: Request, body: dict[str, Any]) -> Any:
        return console.message(target(request), request.path_params["id"])

    def search(request: Request, body: dict[str, Any]) -> Any:
        wanted = request.query_params.get("id", "").strip()
        if not wanted:
            raise ConfigError("search needs ?id=<message id>")
        return {"id": wanted, "found": board.search(wanted)}

    def pool(request: Request, body: dict[str, Any]) -> Any:
        if demo is None:
            raise LookupError("not in demo mode")
        action = request.path_params["action"]
        if action == "enqueue":
            return {"enqueued": demo.enqueue(str(body.get("kind")), int(body.get("count", 0)))}
        if action == "workers":
            demo.configure(PoolSettings(
                size=int(body.get("size", 4)), latency_ms=int(body.get("latency_ms", 300)),
                fail_rate=float(body.get("fail_rate", 0)),
                hang_rate=float(body.get("hang_rate", 0))))
            return demo.state()
        if action == "stop":
            demo.stop()
            return demo.state()
        raise LookupError(f"no demo action {action!r}")

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    routes = [
        Route("/", page),
        Route("/api/overview", api(overview)),
        Route("/api/queue/{kind}/{name}", api(detail)),
        Route("/api/queue/{kind}/{name}/sweep", api(sweep), methods=["POST"]),
        Route("/api/queue/{kind}/{name}/replay", api(replay), methods=["POST"]),
        Route("/api/queue/{kind}/{name}/purge", api(purge), methods=["POST"]),
        Route("/api/queue/{kind}/{name}/delete", api(delete), methods=["POST"]),
        Route("/api/queue/{kind}/{name}/pause", api(pause), methods=["POST"]),
        Route("/api/queue/{kind}/{name}/resume", api(pause), methods=["POST"]),
        Route("/api/queue/{kind}/{name}/retry", api(retry), methods=["POST"]),
        Route("/api/queue/{kind}/{name}/message/{id:path}", api(message)),
        Route("/api/search", api(search)),
        Route("/api/demo/{action}", api(pool), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(Guard, token=token, loopback_only=is_loopback(host))]
    return Starlette(routes=routes, middleware=middleware)


def serve(app: Starlette, host: str, port: int) -> None:
    """Serve ``app`` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning")
