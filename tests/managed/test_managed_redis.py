"""Managed Redis restrictions, simulated on redis-servers of our own (docs/managed-redis.md).

* A server with ``CONFIG``, ``KEYS`` and ``SCAN`` renamed away (as ElastiCache, Memorystore
  and Azure Cache do for CONFIG, and operators do for KEYS) runs the core's whole hot path:
  publish, delayed publish and its promotion, blocking and non-blocking claims, claim_any,
  extend, ack, nack, dead-letter, replay, the sweep's recovery, stats and purge.
* The same hot path as the ACL user of docs/managed-redis.md (denied ``@dangerous``,
  ``KEYS``, ``SCAN`` and ``CONFIG``), whose key patterns are the queues' own keys only
  (``~belayq:{<queue>}:*``): Redis 7 checks
  ACL key patterns for every command a script runs, so an empty ``ACL LOG`` shows that no
  transition touches a key outside the queue's.
* RQ with belayq_rq as a user denied KEYS, SCAN and CONFIG: no attempt in ``ACL LOG``;
  ``belayq queues`` without SCAN says so, and a named queue needs none.
* ``maxmemory-policy``: ``allkeys-*`` gives one ``EvictionRiskWarning`` per client (read from
  ``INFO memory``, never CONFIG); ``noeviction`` and ``volatile-*`` none; a user that may not
  run INFO gets none either, and its queue works.
"""

from __future__ import annotations

import re
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from belayq import EvictionRiskWarning, ReliableQueue
from belayq.claim_any import claim_any
from belayq.embedded import RedisServer
from belayq.keeper import KEEPER
from tests.conftest import any_binary

RENAMED = ["--rename-command", "CONFIG", "", "--rename-command", "KEYS", ""]
RENAMED += ["--rename-command", "SCAN", ""]
PASSWORD = "managed-pw"


def documented_rules() -> list[str]:
    """The rule tokens of the ``ACL SETUSER belayq-managed`` block of docs/managed-redis.md."""
    text = (Path(__file__).parents[2] / "docs" / "managed-redis.md").read_text()
    [block] = re.findall(r"```\n(ACL SETUSER belayq-managed .*?)```", text, re.S)
    return block.split()[3:]


def start(*args: str) -> RedisServer:
    return RedisServer(any_binary(), args=list(args)).start()


@pytest.fixture(scope="module")
def managed() -> Iterator[RedisServer]:
    """A server without CONFIG, KEYS and SCAN, with noeviction (the managed default we ask
    for)."""
    server = start(*RENAMED, "--maxmemory-policy", "noeviction")
    try:
        yield server
    finally:
        KEEPER.stop_all()
        server.stop()


def hot_path(q: ReliableQueue, other: ReliableQueue) -> None:
    """Every call a producer, a consumer and its lease keeper make, with the outcomes."""
    q.publish(b"a")
    q.publish(b"later", delay_ms=50)
    q.publish_many([b"b", b"c"])
    first = q.claim(timeout=1)
    assert [d.payload for d in first] == [b"a"]
    assert q.extend(first) == [True] and q.ack(first[0])
    time.sleep(0.06)
    got = q.claim(timeout=1, count=3)
    assert sorted(d.payload for d in got) == [b"b", b"c", b"later"]  # the delayed one promoted
    by = {d.payload: d for d in got}
    assert q.nack(by[b"b"], reason="retry") == "ready"
    assert q.dead_letter(by[b"c"], "malformed")
    assert q.ack(by[b"later"])
    again = q.claim(timeout=1)
    assert [d.payload for d in again] == [b"b"] and q.ack(again[0])
    assert [x.reason for x in q.dead_letters()] == ["malformed"]
    assert q.replay_dead() == 1
    lost = q.claim(timeout=1)[0]  # never settled: the sweep brings it back after its lease
    time.sleep(0.35)
    assert q.sweep().reclaimed == 1
    back = q.claim(timeout=1)[0]
    assert back.id == lost.id and q.ack(back)
    t0 = time.monotonic()
    assert q.claim(timeout=0.2) == []  # an empty queue: the blocking claim (BLMOVE) times out
    assert time.monotonic() - t0 >= 0.15
    other.publish(b"x")
    picked = claim_any([q, other], timeout=1)  # blocks on both, unblocks the other
    assert [d.payload for d in picked] == [b"x"] and other.ack(picked[0])
    stats = q.stats()
    assert (stats["ready"], stats["in_flight"], stats["dead"]) == (0, 0, 0), stats
    assert q.purge() == 0


def test_hot_path_needs_no_config_keys_or_scan(managed: RedisServer) -> None:
    client = redis.Redis(port=managed.port)
    admin = redis.Redis(port=managed.port)
    try:
        name = f"mr-{uuid.uuid4().hex[:6]}"
        with warnings.catch_warnings():
            warnings.simplefilter("error", EvictionRiskWarning)
            q = ReliableQueue(client, name, lease_ms=300, keeper=False)
            other = ReliableQueue(client, name + "-2", lease_ms=300, keeper=False)
        hot_path(q, other)
        calls = admin.info("commandstats")
        assert not {"cmdstat_config", "cmdstat_keys", "cmdstat_scan"} & set(calls), calls
    finally:
        client.close()
        admin.close()


def test_hot_path_as_a_user_limited_to_the_queues_keys(managed: RedisServer) -> None:
    name = f"mr-acl-{uuid.uuid4().hex[:6]}"
    user = f"queue-{name}"
    admin = redis.Redis(port=managed.port)
    documented = documented_rules()
    assert "~belayq:{orders}:*" in documented, documented
    # The documented rules, for this test's two queues instead of "orders".
    rules = [r.replace("CHANGE-ME", PASSWORD) for r in documented if r[0] not in "~&"]
    assert "~belayq:queues" in documented, documented
    rules += [f"~belayq:{{{name}}}:*", f"~belayq:{{{name}-2}}:*", "~belayq:queues"]
    rules += [f"&belayq:{{{name}}}:*", f"&belayq:{{{name}-2}}:*"]
    admin.execute_command("ACL", "SETUSER", user, *rules)
    admin.acl_log_reset()
    client = redis.Redis(port=managed.port, username=user, password=PASSWORD)
    try:
        q = ReliableQueue(client, name, lease_ms=300, keeper=False)
        other = ReliableQueue(client, name + "-2", lease_ms=300, keeper=False)
        hot_path(q, other)
        refused = [e for e in admin.acl_log() if e.get("username") == user]
        assert refused == [], refused
        # The rules bite: a key outside the queue's, and the commands managed services deny.
        for command in (("GET", "belayq:{elsewhere}:ready"), ("KEYS", "*"), ("SCAN", 0)):
            with pytest.raises(redis.ResponseError):
                client.execute_command(*command)
    finally:
        client.close()
        admin.close()


@pytest.mark.parametrize(
    ("policy", "warned"),
    [
        ("allkeys-lru", True),
        ("allkeys-random", True),
        ("noeviction", False),
        ("volatile-lru", False),
    ],
)
def test_eviction_policy_warning(policy: str, warned: bool) -> None:
    server = start(*RENAMED, "--maxmemory-policy", policy, "--maxmemory", "1gb")
    client = redis.Redis(port=server.port)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for i in range(3):  # one client, three queues, calls: one warning at most
                q = ReliableQueue(client, f"ev-{i}", keeper=False)
                q.publish(b"m")
                assert q.claim(timeout=0)
        risk = [w for w in seen if issubclass(w.category, EvictionRiskWarning)]
        assert len(risk) == (1 if warned else 0), [str(w.message) for w in risk]
        if warned:
            text = str(risk[0].message)
            assert policy in text and "noeviction" in text, text
            assert risk[0].filename == __file__, risk[0].filename  # points at the caller
    finally:
        client.close()
        server.stop()


def test_no_warning_and_no_failure_when_info_is_denied() -> None:
    server = start("--maxmemory-policy", "allkeys-lru", "--maxmemory", "1gb")
    admin = redis.Redis(port=server.port)
    admin.execute_command(
        "ACL", "SETUSER", "noinfo", "on", f">{PASSWORD}", "~*", "&*", "+@all", "-info"
    )
    client = redis.Redis(port=server.port, username="noinfo", password=PASSWORD)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            q = ReliableQueue(client, "ev-noinfo", keeper=False)
            q.publish(b"m")
            [d] = q.claim(timeout=1)
            assert q.ack(d)
        assert not [w for w in seen if issubclass(w.category, EvictionRiskWarning)]
    finally:
        client.close()
        admin.close()
        server.stop()


def test_cli_lists_and_opens_queues_without_scan(
    managed: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tools find queues in the registry: a server that refuses SCAN lists them all."""
    from belayq.cli import main

    client = redis.Redis(port=managed.port)
    try:
        ReliableQueue(client, "mr-cli", keeper=False).publish(b"m")
    finally:
        client.close()
    url = f"redis://127.0.0.1:{managed.port}/0"
    assert main(["queues", "--url", url]) == 0
    assert "mr-cli" in capsys.readouterr().out
    assert main(["stats", "--url", url, "mr-cli"]) == 0
    assert "ready" in capsys.readouterr().out


def test_eviction_warning_reads_every_primary_of_a_cluster() -> None:
    """One primary of three evicts: the warning comes (read from every primary's INFO)."""
    from redis.cluster import ClusterNode, RedisCluster

    from belayq.embedded import RedisClusterServers

    with RedisClusterServers(any_binary()) as cluster:
        last = cluster.nodes[-1]
        redis.Redis(port=last.port).config_set("maxmemory-policy", "allkeys-lfu")
        redis.Redis(port=last.port).config_set("maxmemory", "1gb")  # a limit: it may evict
        client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                ReliableQueue(client, "ev-cluster", keeper=False)
                ReliableQueue(client, "ev-cluster-2", keeper=False)
            risk = [str(w.message) for w in seen if issubclass(w.category, EvictionRiskWarning)]
            assert len(risk) == 1 and "allkeys-lfu" in risk[0], risk
        finally:
            client.close()


def test_an_rq_worker_needs_no_config_keys_or_scan() -> None:
    """belayq_rq and RQ itself, as a user denied only KEYS, SCAN and CONFIG (on a server
    that still has them, so that an attempt is refused by the ACL and logged, not unknown):
    a burst worker runs the jobs (one fails) and ``ACL LOG`` holds no attempt. (A real
    ``celery worker`` and ``rq worker`` as users that may not run them:
    tests/security/test_acl.py.)"""
    import rq
    from rq.job import JobStatus

    import belayq_rq
    from tests.plugins.rq import jobs

    server = start()
    admin = redis.Redis(port=server.port)
    rules = ["on", f">{PASSWORD}", "~*", "&*", "+@all", "-keys", "-scan", "-config"]
    admin.execute_command("ACL", "SETUSER", "rq-managed", *rules)
    admin.acl_log_reset()
    conn = redis.Redis(port=server.port, username="rq-managed", password=PASSWORD)
    try:
        q = rq.Queue(f"mr-rq-{uuid.uuid4().hex[:6]}", connection=conn)
        ok = [q.enqueue(jobs.add, i, 1) for i in range(3)]
        bad = q.enqueue(jobs.fail)
        belayq_rq.SimpleWorker([q.name], connection=conn).work(burst=True, logging_level="CRITICAL")
        assert [j.get_status() for j in ok] == [JobStatus.FINISHED] * 3
        assert [j.return_value() for j in ok] == [1, 2, 3]
        assert bad.get_status() == JobStatus.FAILED
        refused = [e for e in admin.acl_log() if e.get("username") == "rq-managed"]
        assert refused == [], refused
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.keys("*")  # the rules bite, and would have been logged
        assert [e.get("object") for e in admin.acl_log()] == ["keys"]
    finally:
        KEEPER.stop_all()
        conn.close()
        admin.close()
        server.stop()
