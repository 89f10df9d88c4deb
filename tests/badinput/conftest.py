"""Fixtures of the bad-input tests: one redis-server per module, and a client of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from belayq.embedded import RedisServer
from tests.conftest import any_binary, client_of


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(any_binary()) as s:
        yield s


@pytest.fixture(scope="module")
def conn(server: RedisServer) -> Iterator[redis.Redis]:
    with client_of(server) as c:
        yield c
