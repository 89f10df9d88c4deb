"""The guard in front of the dashboard: it can replay, sweep and purge, so

* bound to a loopback address by default (any of them: ``--host 127.0.0.2`` too), and then
  only answering requests whose Host is a loopback name or address (a page on another site
  cannot reach it through DNS rebinding: its Host is that site's name);
* bound elsewhere only with a token (``belayq dashboard --host 0.0.0.0 --token T``), which
  every API request must carry (``Authorization: Bearer T``; the page takes it from its
  address's ``#token=T`` fragment, which browsers never send to a server);
* a POST must be ``application/json``, which a form on another site cannot send without a
  CORS preflight this app never grants.
"""

from __future__ import annotations

import hmac
import ipaddress

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def host_name(header: str) -> str:
    """The name or address of a Host header, without its port (``[::1]:80`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard:
    """The Host check of a loopback dashboard, the token check on ``/api/`` and the JSON-only
    rule for POSTs (see the module doc)."""

    def __init__(self, app: ASGIApp, token: str | None, loopback_only: bool) -> None:
        self.app = app
        self.token = token
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.loopback_only:
            host = Request(scope).headers.get("host", "")
            if not is_loopback(host_name(host)):
                await Response("Invalid host header", status_code=400,
                               media_type="text/plain")(scope, receive, send)
                return
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            request = Request(scope)
            refusal = self._refusal(request)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, request: Request) -> Response | None:
        if self.token is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return JSONResponse({"error": "a token is required"}, status_code=401)
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if request.method == "POST" and kind != "application/json":
            return JSONResponse({"error": "POST application/json"}, status_code=415)
        return None
