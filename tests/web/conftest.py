"""The dashboard's fixtures: a private server emptied per test, apps served by a real
uvicorn on a free port, and a page in a real headless Chromium (Debian's, driven by
Playwright, in UTC so the graph's time axis is the same everywhere)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import redis

from belayq.embedded import RedisServer, free_port
from tests.conftest import flushed_client, unavailable
from tests.support import wait_for

uvicorn = pytest.importorskip("uvicorn")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def client(private_redis: RedisServer) -> Iterator[redis.Redis]:
    with flushed_client(private_redis) as c:
        yield c


@contextmanager
def _served(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 20, "uvicorn to start")
        yield f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def served() -> Callable[..., AbstractContextManager[str]]:
    """``with served(app) as base_url:`` serves ``app`` until the block ends."""
    return _served


@pytest.fixture
def page() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        unavailable("no chromium (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000},
                                    timezone_id="UTC", locale="en-US")
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()
