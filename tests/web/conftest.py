"""The dashboard's fixtures: a private server emptied per test, and apps served by a real
uvicorn on a free port."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import redis

from belayq.embedded import RedisServer, free_port
from tests.conftest import flushed_client
from tests.support import wait_for

uvicorn = pytest.importorskip("uvicorn")


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
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def served() -> Callable[..., AbstractContextManager[str]]:
    """``with served(app) as base_url:`` serves ``app`` until the block ends."""
    return _served
