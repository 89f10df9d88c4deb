"""ShardedQueue: one hot queue spread over N hash tags (N slots, so N cluster nodes).

Shown on a real server and on the 3-master ``cluster_servers`` cluster: the shards land on
distinct slots on distinct nodes; every message is consumed exactly once; a blocked consumer
wakes for a message on any shard and sends next to nothing while it waits; FIFO and
priorities hold within a shard; fencing stays per shard; stats, dead letters, replay,
history, purge and drop see the logical queue, and so do the command line and the metrics;
the shard count cannot be changed under the messages; an idle consumer creates no keys; and
after a kill -9 of a consumer (holding claims, or mid-stream) every message it held comes
back, and nothing it acked runs again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from belayq import ConfigError, Delivery, ReliableQueue, ShardedQueue
from belayq.embedded import RedisClusterServers
from belayq.keys import MAX_SHARDS, SLOTS, QueueKeys, shard_names
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(cluster_servers: RedisClusterServers) -> Iterator[RedisCluster]:
    c = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_servers.startup_nodes])
    yield c
    c.close()


@pytest.fixture
def name() -> str:
    return f"hot-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def opened() -> Iterator[list[ShardedQueue]]:
    """Queues a test opened; closed (keepers stopped, nothing released) after it."""
    made: list[ShardedQueue] = []
    yield made
    for q in made:
        q.close(release=False)


def sharded(made: list[ShardedQueue], client: Any, name: str, **options: Any) -> ShardedQueue:
    options.setdefault("keeper", False)
    q = ShardedQueue(client, name, **options)
    made.append(q)
    return q


def drain(q: ShardedQueue, count: int = 7) -> list[Delivery]:
    """Claim and ack until a claim waits 0.3 s for nothing; every claim, in order."""
    got: list[Delivery] = []
    while batch := q.claim(timeout=0.3, count=count):
        assert all(q.ack_many(batch))
        got += batch
    return got


def node_port(client: RedisCluster, shard: ReliableQueue) -> int:
    return int(client.get_node_from_key(shard.keys.ready).port)


def node_clients(cluster_servers: RedisClusterServers) -> list[redis.Redis]:
    return [redis.Redis(port=n.port) for n in cluster_servers.nodes]


def keys_named(clients: list[redis.Redis], name: str) -> set[bytes]:
    return {k for c in clients for k in c.scan_iter(match=f"*{name}*", count=1000)}


# -- the shard names -------------------------------------------------------------------------


def test_shard_names_are_stable_and_hash_to_distinct_spread_slots() -> None:
    assert shard_names("orders", 1) == ("orders",)  # today's queue, nothing renamed
    for n in (2, 3, 4, 6, 8, MAX_SHARDS):
        names = shard_names("orders", n)
        slots = [key_slot(QueueKeys.build(s).ready.encode()) for s in names]
        assert len(set(names)) == len(set(slots)) == n
        width = SLOTS / n
        for i, slot in enumerate(slots):  # shard i sits mid-way in the i-th of n slot ranges
            assert abs(slot - (i + 0.5) * width) <= width / 8, (n, i, slot)
    assert shard_names("orders", 3) == shard_names("orders", 3)  # the same in every process
    for bad in (0, -1, MAX_SHARDS + 1, 2.0, True, "3"):
        with pytest.raises(ConfigError, match="shards must be an int"):
            shard_names("orders", bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="braces"):
        shard_names("a{b}", 3)


def test_one_shard_is_the_plain_queue_byte_for_byte(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=1)
    q.publish(b"x")
    plain_keys = set(QueueKeys.build(name).all_keys())
    assert keys_named([r], name) <= {k.encode() for k in plain_keys}
    assert r.hget(QueueKeys.build(name).stats, "shards") is None  # nothing recorded
    plain = ReliableQueue(r, name, keeper=False)  # the plain queue sees it, and may claim it
    [d] = plain.claim(timeout=0)
    assert (d.payload, d.queue, d.shard) == (b"x", name, "")
    assert plain.ack(d)


# -- spread and exactly once -----------------------------------------------------------------


@pytest.mark.parametrize("shards", [3, 6])
def test_cluster_spreads_over_the_nodes_and_each_message_runs_once(
    cluster: RedisCluster, name: str, opened: list[ShardedQueue], shards: int
) -> None:
    q = sharded(opened, cluster, name, shards=shards)
    ids = q.publish_many([b"m%03d" % i for i in range(120)]) + [
        q.publish(b"one%02d" % i) for i in range(shards * 4)
    ]
    per_shard = {s: st["ready"] for s, st in q.shard_stats().items()}
    assert sorted(per_shard.values()) == [120 // shards + 4] * shards, per_shard
    per_node = Counter(node_port(cluster, s) for s in q.shards)
    assert len(per_node) == 3 and set(per_node.values()) == {shards // 3}, per_node
    got = drain(q)
    assert sorted(d.id for d in got) == sorted(ids)  # every message once, none twice
    assert {d.queue for d in got} == {name}
    assert {d.shard for d in got} == {s.name for s in q.shards}
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["acked"], s["shards"]) == (0, 0, len(ids), shards)


def test_every_backend_runs_each_message_once(
    any_client: Any, name: str, opened: list[ShardedQueue]
) -> None:
    """Redis 7, Redis 6.2 (belayq's floor), the cluster and fakeredis (users' unit tests)."""
    q = sharded(opened, any_client, name, shards=3)
    ids = q.publish_many([f"m{i}" for i in range(20)])
    assert sorted(d.id for d in drain(q, count=3)) == sorted(ids)
    assert q.stats()["acked"] == 20
    assert q.drop()


def test_two_consumers_in_threads_run_each_message_once(
    cluster: RedisCluster, name: str, opened: list[ShardedQueue]
) -> None:
    producer = sharded(opened, cluster, name, shards=3)
    ids = producer.publish_many([b"m%03d" % i for i in range(150)])
    consumers = [sharded(opened, cluster, name, shards=3) for _ in range(2)]
    got: list[list[Delivery]] = [[], []]
    threads = [threading.Thread(target=lambda i=i: got[i].extend(drain(consumers[i], 3)))
               for i in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(d.id for g in got for d in g) == sorted(ids)


def test_a_process_that_publishes_and_claims_alternately_still_spreads(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=2)
    for i in range(6):
        q.publish(f"m{i}")
        [d] = q.claim(timeout=0)
        assert q.ack(d)
    assert [s["published"] for s in q.shard_stats().values()] == [3, 3]


def test_ack_and_claim_moves_on_to_the_other_shards(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=3)
    ids = q.publish_many([f"m{i}" for i in range(20)])
    seen = [*q.claim(timeout=0, count=2)]
    held = list(seen)
    while held:
        acked, held = q.ack_and_claim(held, 2)
        assert all(acked)
        seen += held
    assert sorted(d.id for d in seen) == sorted(ids)
    assert q.stats()["acked"] == 20


def test_dedup_ids_hash_to_one_shard_so_dedup_still_holds(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=4)
    firsts = [q.publish_result(b"a", dedup_id=f"order-{i}") for i in range(8)]
    again = [q.publish_result(b"b", dedup_id=f"order-{i}") for i in range(8)]
    assert all(f.stored for f in firsts) and not any(a.stored for a in again)
    assert [a.id for a in again] == [f.id for f in firsts]
    assert {a.state for a in again} == {"ready"}
    assert q.stats()["ready"] == 8


# -- blocking without polling ----------------------------------------------------------------


def stack_of(t: threading.Thread) -> str:
    """Where thread ``t`` is now (for a wait that failed)."""
    frame = sys._current_frames().get(t.ident or 0)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(ended)"


def test_a_blocked_consumer_wakes_for_any_shard_and_is_quiet_while_it_waits(
    cluster_servers: RedisClusterServers, name: str, opened: list[ShardedQueue],
    sent: Counter[threading.Thread],
) -> None:  # fmt: skip
    # What the consumer's thread sends is counted client-side (the `sent` fixture): on the
    # shared cluster, other tests' lease keepers may talk to the nodes, so the servers' own
    # counters cannot tell this consumer's commands apart.
    # The consumer's connections carry a name of their own, so the nodes' client lists tell
    # its BLMOVEs apart from any other client's, blocked or not, on the shared cluster.
    me = f"consumer-{name}"
    client = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in cluster_servers.startup_nodes],
        client_name=me,
    )
    q = sharded(opened, client, name, shards=3)
    nodes = node_clients(cluster_servers)

    def blocked() -> list[int]:
        """Per node, this consumer's connections blocked in BLMOVE."""
        return [sum(1 for x in c.client_list() if x.get("name") == me
                    and "b" in x.get("flags", "") and x.get("cmd") == "blmove")
                for c in nodes]  # fmt: skip

    def claim(out: list[Any]) -> None:
        try:
            out.append(q.claim(timeout=20))
        except BaseException as exc:  # shown by the wait below
            out.append(exc)
            raise

    for target in q.shards:
        out: list[Any] = []
        t = threading.Thread(target=claim, args=(out,))
        t.start()
        # 3 claim scripts and 3 BLMOVEs at least (counting works), one blocked on each node.
        wait_for(lambda t=t, out=out: out or (sent[t] >= 6 and blocked() == [1, 1, 1]), 30,
                 lambda t=t, out=out: f"a BLMOVE blocked on every node: {blocked()}, "
                                      f"{sent[t]} commands sent, alive {t.is_alive()}, "
                                      f"{out}; where it is:\n{stack_of(t)}")  # fmt: skip
        assert not out, f"the claim ended before it blocked: {out}"
        settled = [sent[t]]

        def quiet(t: threading.Thread = t, settled: list[int] = settled) -> bool:
            time.sleep(0.2)  # its last sends are out (a busy poller never gets here)
            settled.append(sent[t])
            return settled[-1] == settled[-2]

        wait_for(quiet, 5, "the consumer's sends to end")
        before = sent[t]
        time.sleep(1.0)  # an idle second: what does a blocked consumer send meanwhile?
        print(f"\ncommands a blocked consumer sent in an idle second: {sent[t] - before}")
        assert sent[t] == before
        t0 = time.monotonic()
        msg_id = target.publish(b"wake")  # straight onto one shard
        t.join(10)
        waited = time.monotonic() - t0
        assert [(d.id, d.shard) for d in out[0]] == [(msg_id, target.name)]
        assert waited < 2.0, waited
        assert q.ack(out[0][0])
        wait_for(lambda: blocked() == [0, 0, 0], 5, "the other shards' BLMOVEs released")
    for c in nodes:
        c.close()
    client.close()


def test_an_idle_consumer_creates_no_keys(
    cluster: RedisCluster, cluster_servers: RedisClusterServers, name: str,
    opened: list[ShardedQueue],
) -> None:  # fmt: skip
    nodes = node_clients(cluster_servers)
    q = sharded(opened, cluster, name, shards=3, keeper=True, sweep_interval_ms=50)
    record = QueueKeys.build(name).stats.encode()
    assert keys_named(nodes, name) == {record}  # the shard count, recorded at open
    for _ in range(3):  # about a second of blocked claims, the keeper sweeping all along
        assert q.claim(timeout=0.3) == []
    assert keys_named(nodes, name) == {record}
    for c in nodes:
        c.close()


# -- order, fencing ----------------------------------------------------------------------------


def test_fifo_and_priorities_hold_within_each_shard(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=3)
    for i in range(24):
        q.publish(f"low-{i:02d}", priority=5)
    for i in range(24):
        q.publish(f"high-{i:02d}", priority=0)
    order: dict[str, list[str]] = {}
    for d in drain(q, count=1):
        order.setdefault(d.shard, []).append(d.payload.decode())
    assert len(order) == 3
    for shard, seen in order.items():
        kinds = [p.split("-")[0] for p in seen]
        assert kinds == sorted(kinds), (shard, seen)  # every high before any low
        for kind in ("high", "low"):
            seq = [p for p in seen if p.startswith(kind)]
            assert seq == sorted(seq), (shard, seq)  # FIFO within a priority


def test_delayed_messages_fall_due_within_their_shard_and_wake_a_blocked_claim(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=3)
    ids = {q.publish(f"later-{i}", delay_ms=300) for i in range(3)}
    assert [s["delayed"] for s in q.shard_stats().values()] == [1, 1, 1]
    t0 = time.monotonic()
    got: list[Delivery] = []
    while len(got) < 3 and time.monotonic() - t0 < 10:
        got += q.claim(timeout=5, count=3)
    assert {d.id for d in got} == ids
    assert 0.25 < time.monotonic() - t0 < 3


def test_an_ack_after_a_shards_lease_expired_is_refused(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=3, lease_ms=200)
    q.publish_many([b"a", b"b", b"c"])
    first = q.claim(timeout=0, count=3)
    assert len({d.shard for d in first}) == 3
    again: list[Delivery] = []
    wait_for(lambda: again.extend(q.claim(timeout=0, count=3)) or len(again) == 3, 10,
             "the expired claims redelivered")  # fmt: skip
    assert sorted(d.id for d in again) == sorted(d.id for d in first)
    assert q.ack_many(first) == [False] * 3  # fenced, each by its own shard
    assert q.stats()["stale_acks"] == 3
    assert q.ack_many(again) == [True] * 3
    with pytest.raises(ConfigError, match="each shard's channel"):
        q.events()
    foreign = Delivery("x", b"", "t", 1, "other-queue")
    with pytest.raises(ConfigError, match="not claimed from"):
        q.ack(foreign)


# -- the logical queue's inspection -------------------------------------------------------------


def test_stats_dead_letters_replay_history_purge_and_drop_see_the_logical_queue(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=3, max_deliveries=1, history_max=20)
    q.publish_many([f"m{i}" for i in range(6)])
    got = q.claim(timeout=0, count=6)
    assert len(got) == 6
    for d in got[:3]:
        assert q.nack(d, reason=f"boom {d.id}") == "dead"
    assert q.ack_many(got[3:], ["ok"] * 3) == [True] * 3
    s = q.stats()
    assert (s["dead"], s["acked"], s["dead_lettered"], s["ready"]) == (3, 3, 3, 0)
    per = q.shard_stats()
    assert sum(x["dead"] for x in per.values()) == 3 and len(per) == 3
    dead = q.dead_letters()
    assert sorted(x.id for x in dead) == sorted(d.id for d in got[:3])
    assert all(x.reason.startswith(f"boom {x.id} (ran 1 times") for x in dead)
    assert [x.dead_at_ms for x in dead] == sorted((x.dead_at_ms for x in dead), reverse=True)
    assert len(q.dead_letters(limit=2)) == 2
    assert {h.id for h in q.history("done")} == {d.id for d in got[3:]}
    assert {h.id for h in q.history("failed")} == {d.id for d in got[:3]}
    assert q.replay_dead([got[0].id, "no-such-id"]) == 1
    assert q.replay_dead(limit=1) == 1
    assert q.replay_dead() == 1
    s = q.stats()
    assert (s["dead"], s["ready"]) == (0, 3)
    q.publish("later", delay_ms=60_000)
    assert q.purge() == 4
    assert q.stats()["ready"] == q.stats()["delayed"] == 0
    q.publish("held")
    [held] = q.claim(timeout=0)
    assert q.drop() is False  # a claim is held: nothing deleted
    assert q.ack(held)
    assert q.drop() is True
    assert keys_named([r], name) == set()  # every shard and the recorded count are gone


def test_the_shard_count_cannot_change_under_the_messages(
    r: redis.Redis, name: str, opened: list[ShardedQueue]
) -> None:
    q = sharded(opened, r, name, shards=3)
    q.publish(b"x")
    with pytest.raises(ConfigError, match=r"sharded over 3 shards.*not 4"):
        ShardedQueue(r, name, shards=4)
    with pytest.raises(ConfigError, match="sharded over 3 shards"):
        ReliableQueue(r, name)
    with pytest.raises(ConfigError, match="sharded over 3 shards"):
        ShardedQueue(r, name, shards=1)
    [d] = q.claim(timeout=0)
    q.ack(d)
    assert q.drop()
    assert sharded(opened, r, name, shards=2).stats()["shards"] == 2  # dropped: a new count

    plain = ReliableQueue(r, f"{name}-p", keeper=False)
    plain.publish(b"y")
    with pytest.raises(ConfigError, match=r"holds 1 message.*unsharded"):
        ShardedQueue(r, f"{name}-p", shards=3)
    [d] = plain.claim(timeout=0)
    plain.ack(d)
    assert sharded(opened, r, f"{name}-p", shards=3).stats()["ready"] == 0  # drained: ok


def test_command_line_and_metrics_see_one_logical_queue(
    r: redis.Redis, name: str, opened: list[ShardedQueue], capsys: pytest.CaptureFixture[str]
) -> None:
    from belayq.cli import main
    from belayq.discovery import Found, list_queues
    from belayq.metrics import QueueCollector

    q = sharded(opened, r, name, shards=3, max_deliveries=1)
    q.publish_many([f"m{i}" for i in range(5)])
    [d] = q.claim(timeout=0)
    q.nack(d, reason="bad")
    found = [f for f in list_queues(r) if name in f.name]
    assert [(f.kind, f.name, f.record is not None and f.record.shards) for f in found] == [
        ("belayq", name, 3)]
    assert Found("belayq", name, found[0].record) == found[0]
    url = f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}/0"
    assert main(["stats", "--url", url, name, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["ready"], stats["dead"], stats["shards"]) == (4, 1, 3)
    assert sorted(stats["by_shard"]) == sorted(s.name for s in q.shards)
    assert main(["dead", "--url", url, name, "--json"]) == 0
    [row] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (row["id"], row["reason"].split(" (")[0]) == (d.id, "bad")
    assert main(["replay", "--url", url, name, "--all"]) == 0
    assert "replayed 1" in capsys.readouterr().out
    [held] = q.claim(timeout=0)
    assert main(["inspect", "--url", url, name, "--json"]) == 0
    assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == [held.id]
    assert main(["queues", "--url", url, "--json"]) == 0
    [listed] = [row for x in capsys.readouterr().out.splitlines()
                if name in (row := json.loads(x))["queue"]]  # fmt: skip
    assert (listed["queue"], listed["shards"], listed["ready"]) == (name, 3, 4)
    assert q.release([held]) == 1
    samples = {(m.name, s.labels.get("priority")): s.value
               for m in QueueCollector(lambda: [q]).collect() for s in m.samples
               if s.labels.get("queue") == name}  # fmt: skip
    assert samples[("belayq_ready", "0")] == 5
    assert samples[("belayq_dead_lettered", None)] == 1


# -- kill -9 -------------------------------------------------------------------------------------

CHILD = """
import sys, time
from redis.cluster import ClusterNode, RedisCluster
from belayq import ShardedQueue
port, name = int(sys.argv[1]), sys.argv[2]
q = ShardedQueue(RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port)]), name,
                 shards=3, lease_ms=1000, sweep_interval_ms=100)
held = []
while len(held) < 12:
    held += q.claim(timeout=5, count=12 - len(held))
print("HOLDING", " ".join(d.id for d in held), flush=True)
time.sleep(600)
"""


def test_kill_9_of_a_consumer_brings_every_message_it_held_back(
    cluster: RedisCluster, cluster_servers: RedisClusterServers, name: str,
    opened: list[ShardedQueue],
) -> None:  # fmt: skip
    q = sharded(opened, cluster, name, shards=3, lease_ms=1000, sweep_interval_ms=100)
    ids = q.publish_many([b"m%02d" % i for i in range(30)])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cluster_servers.nodes[0].port), name],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("HOLDING"), line
        held = set(line.split()[1:])
        assert len(held) == 12
        time.sleep(1.5)  # longer than the lease: the child's keeper must keep its claims
        assert q.stats()["in_flight"] == 12
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)
        got: list[Delivery] = []
        wait_for(lambda: got.extend(drain(q)) or len(got) >= len(ids), 15,
                 lambda: f"{len(got)} of {len(ids)} back")  # fmt: skip
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    assert sorted(d.id for d in got) == sorted(ids)  # all back, each once
    assert {d.id for d in got if d.deliveries == 2} == held
    assert q.stats()["reclaimed"] == 12


STREAM_CHILD = """
import os, sys, time
from redis.cluster import ClusterNode, RedisCluster
from belayq import ShardedQueue
port, name, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
q = ShardedQueue(RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port)]), name,
                 shards=3, lease_ms=1000, sweep_interval_ms=100)
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
while True:
    for d in q.claim(timeout=1, count=2):
        os.write(fd, f"claimed {d.id}\\n".encode())
        time.sleep(0.005)
        if q.ack(d):
            os.write(fd, f"acked {d.id}\\n".encode())
"""


def test_kill_9_of_a_consumer_mid_stream_loses_nothing_and_runs_nothing_twice(
    cluster: RedisCluster, cluster_servers: RedisClusterServers, name: str,
    opened: list[ShardedQueue], tmp_path: Path,
) -> None:  # fmt: skip
    q = sharded(opened, cluster, name, shards=3, lease_ms=1000, sweep_interval_ms=100)
    ids = q.publish_many([b"m%03d" % i for i in range(300)])
    log = tmp_path / "child.log"
    child = subprocess.Popen(
        [sys.executable, "-c", STREAM_CHILD, str(cluster_servers.nodes[0].port), name, str(log)],
    )  # fmt: skip

    def logged(what: str) -> set[str]:
        lines = log.read_text().splitlines() if log.exists() else []
        return {line.split()[1] for line in lines if line.startswith(what + " ")}

    try:
        wait_for(lambda: len(logged("acked")) >= 60, 20, "the child acking")
        os.kill(child.pid, signal.SIGKILL)  # mid-stream: between any two of its calls
        child.wait(5)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    claimed, acked = logged("claimed"), logged("acked")
    got: list[Delivery] = []
    wait_for(lambda: got.extend(drain(q)) or q.stats()["acked"] >= len(ids), 15,
             lambda: f"{q.stats()}")  # fmt: skip
    survivor = {d.id for d in got}
    assert not survivor & acked  # an ack that returned True is final: never run again
    assert len(got) == len(survivor)
    unseen = set(ids) - survivor - acked  # acked by the child, killed before it logged
    assert unseen <= claimed - acked and len(unseen) <= 2
    s = q.stats()
    assert (s["acked"], s["ready"], s["in_flight"], s["delayed"]) == (len(ids), 0, 0, 0)
