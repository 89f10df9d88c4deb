"""Fixtures shared by the core's tests: a private server for the tools, and a queue in
every script mode."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.cli import main
from belayq.embedded import RedisServer, free_port
from tests.conftest import any_binary, client_of, make_client, unavailable
from tests.security.test_tls import make_ca


@pytest.fixture
def server(private_redis: RedisServer) -> Iterator[RedisServer]:
    with client_of(private_redis) as c:
        c.flushall()
    yield private_redis


@pytest.fixture
def url(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    with client_of(server) as c:
        yield c


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


MODES = [("redis", None), ("redis", False), ("redis62", None)]


@pytest.fixture(params=MODES, ids=["redis-functions", "redis-scripts", "redis62"])
def q(request: pytest.FixtureRequest, make_queue: Any) -> Iterator[ReliableQueue]:
    backend, functions = request.param
    client = make_client(request, backend)
    yield make_queue(client, lease_ms=5_000, max_deliveries=3, lua_functions=functions)
    client.close()


def scrape_once(url: str, *argv: str) -> dict[str, float]:
    """One scrape of a real ``belayq exporter`` process."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "belayq", "exporter", "--url", url,
                             "--port", str(port), *argv], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "exporter on" in proc.stdout.readline()
        deadline = time.monotonic() + 20
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("belayq_"):
            series, value = line.rsplit(" ", 1)
            assert series not in out, f"two samples of {series}"
            out[series] = float(value)
    return out


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, int, Path]]:
    """(server, TLS port, CA file): a redis-server with a plain port and a TLS port."""
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca(d)
    port = free_port()
    server = RedisServer(any_binary(), args=[
        "--tls-port", str(port), "--tls-cert-file", str(d / "server.pem"),
        "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(ca),
        "--tls-auth-clients", "no",
    ])  # fmt: skip
    try:
        server.start()
    except RuntimeError as exc:
        unavailable(f"this redis-server has no TLS support: {exc}")
    yield server, port, ca
    server.stop()
