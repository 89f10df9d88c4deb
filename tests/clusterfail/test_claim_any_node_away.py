"""A consumer of queues on several cluster nodes while one node is away.

A 3-shard ``ShardedQueue`` (one shard per master of a 3-master, 3-replica cluster) has one
consumer thread in a claim loop and a producer. The master of one shard is killed
(SIGKILL); until its replica takes over, that shard is away. The consumer keeps claiming
the messages published to the other two shards, each within a second of its publish; it
tries the away shard again now and then, without a busy loop; and once the replica took
over, the away shard's messages are claimed too.

Two set-ups:

* ``default``: ``cluster-node-timeout`` 1500 ms and Redis's default
  ``cluster-require-full-coverage yes``: between the moment the cluster marks the master
  failed and its replica's promotion, every master answers CLUSTERDOWN (nothing can be
  claimed anywhere then; the consumer rides it out).
* ``partial``: ``cluster-node-timeout`` 3000 ms and ``cluster-require-full-coverage no``:
  the healthy masters serve all along, and the shard stays away for several seconds.

What the consumer's thread sends is counted client-side (one count per command or
pipeline, connection attempts to the dead node included).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from belayq import ConnectionLost, ReliableQueue, ShardedQueue
from belayq.claim_any import claim_any
from belayq.embedded import RedisClusterServers
from belayq.keeper import KEEPER
from tests.conftest import any_binary
from tests.support import wait_for

from .conftest import cluster_client

pytestmark = pytest.mark.timeout(240)

SETUPS = {
    "default": (1500, []),
    "partial": (3000, ["--cluster-require-full-coverage", "no"]),
}


@pytest.fixture(params=sorted(SETUPS))
def away_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, RedisClusterServers]]:
    node_timeout_ms, args = SETUPS[request.param]
    cluster = RedisClusterServers(any_binary(), replicas=1, node_timeout_ms=node_timeout_ms,
                                  args=args)  # fmt: skip
    try:
        cluster.start()
        yield request.param, cluster
    finally:
        KEEPER.stop_all()
        cluster.stop()


@dataclass
class Consumer:
    """A claim loop in a thread of its own, recording each claim (monotonic s, payload)."""

    q: ShardedQueue
    claimed: dict[bytes, float] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Consumer:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for d in self.q.claim(timeout=1):
                    self.claimed[d.payload] = time.monotonic()
                    self.q.ack(d)
            except Exception as exc:  # recorded: the test fails on any
                self.errors.append(exc)
                time.sleep(0.1)




def test_a_consumer_of_several_nodes_keeps_claiming_while_one_node_is_away(
    away_cluster: tuple[str, RedisClusterServers], sent: Counter[threading.Thread]
) -> None:
    setup, cluster = away_cluster
    name = f"away-{uuid.uuid4().hex[:6]}"
    clients = [cluster_client(cluster) for _ in range(2)]
    consumer = Consumer(ShardedQueue(clients[0], name, shards=3, lease_ms=30_000)).start()
    producer = ShardedQueue(clients[1], name, shards=3, keeper=False)
    masters = [cluster.master_of_key(s.keys.ready) for s in producer.shards]
    assert len({m.port for m in masters}) == 3  # one shard per master
    victim, *healthy = producer.shards
    published: dict[bytes, float] = {}  # payload -> monotonic s when its publish returned
    try:
        for s in producer.shards:  # warm up: every shard's connections are open
            s.publish(b"warm-" + s.name.encode())
            published[b"warm-" + s.name.encode()] = time.monotonic()
        wait_for(lambda: len(consumer.claimed) == 3, 10, "the warm-up claims")

        replica = cluster.replica_of(masters[0])
        t_kill = time.monotonic()
        cluster.kill(masters[0])
        promoted = threading.Event()

        idle: list[int] = []  # the consumer's sends in a second without messages

        def produce() -> None:
            i = 0
            while not promoted.is_set():
                if i == 5:  # an idle second: what does the consumer send meanwhile?
                    time.sleep(1.0)  # its last claims are done, its looks at 0.5 s apart
                    before = sent[consumer.thread]  # type: ignore[index]
                    time.sleep(1.0)
                    idle.append(sent[consumer.thread] - before)  # type: ignore[index]
                payload = b"healthy-%03d" % i
                healthy[i % 2].publish(payload)
                published[payload] = time.monotonic()
                i += 1
                time.sleep(0.1)

        producing = threading.Thread(target=produce, daemon=True)
        producing.start()
        # An election a loaded box lets time out is held again 4 node timeouts later.
        promoted_s = cluster.wait_promoted(replica, timeout_s=120)
        promoted.set()
        producing.join(30)
        after = b"victim-after-failover"
        victim.publish(after)
        published[after] = time.monotonic()
        missing = lambda: set(published) - set(consumer.claimed)  # noqa: E731
        wait_for(lambda: not missing(), 30, lambda: f"every claim; missing {missing()}")
    finally:
        consumer.stop.set()
        if consumer.thread is not None:
            consumer.thread.join(15)
        for c in clients:
            c.close()

    assert not consumer.errors, consumer.errors
    during = {p: consumer.claimed[p] - t for p, t in published.items() if p.startswith(b"healthy")}
    slowest = max(during.values())
    first = min(consumer.claimed[p] for p in during) - t_kill
    print(f"\n[{setup}] master killed, replica promoted {promoted_s:.2f} s later; "
          f"{len(during)} messages on the other shards meanwhile: first claimed {first:.2f} s "
          f"after the kill, slowest {slowest * 1000:.0f} ms after its publish; the consumer "
          f"sent {idle} command(s) in an idle second while the shard was away; the away "
          f"shard's message claimed {consumer.claimed[after] - published[after]:.2f} s after "
          "its publish")  # fmt: skip
    assert len(during) >= 5
    assert slowest < 1.0, sorted(during.items(), key=lambda x: -x[1])[:5]
    # Looks at the away node are 0.5 s apart; each costs a few sends (CLUSTER SLOTS, the
    # blocking claims on the other nodes, a keeper beat): 6 to 26 were seen on a loaded box.
    # A loop that did not pause sends hundreds.
    assert idle and idle[0] < 60, f"{idle} sends in an idle second: a busy loop?"
    assert consumer.claimed[after] - published[after] < 5


def test_connection_lost_comes_only_when_every_queue_was_away_for_cluster_retry_ms() -> None:
    """A master killed with no replica to take over: ``claim_any`` over its queue and a
    queue on a live master keeps serving the live one past ``cluster_retry_ms``; over the
    dead master's queue alone it raises ConnectionLost once that queue has been away for
    that long (at once when it has been already; the next call tries it afresh)."""
    cluster = RedisClusterServers(any_binary())
    try:
        cluster.start()
        client = cluster_client(cluster)
        tag = uuid.uuid4().hex[:6]
        qs = [ReliableQueue(client, f"away-{tag}-{i}", keeper=False, cluster_retry_ms=1000)
              for i in range(12)]  # fmt: skip
        by_master = {cluster.master_of_key(q.keys.ready).port: q for q in qs}
        assert len(by_master) == 3
        dead_port, dead = next(iter(by_master.items()))
        live = next(q for port, q in by_master.items() if port != dead_port)
        # Loads the scripts on every master: a node that lacks them has them loaded on every
        # master, which a dead one refuses.
        assert claim_any([dead, live], timeout=0) == []
        cluster.kill(next(n for n in cluster.nodes if n.port == dead_port))
        t0 = time.monotonic()
        assert claim_any([dead, live], timeout=2.0) == []  # no error: the live one answers
        assert 1.9 < time.monotonic() - t0 < 10
        msg_id = live.publish(b"still served")
        assert [d.id for d in claim_any([dead, live], timeout=2.0)] == [msg_id]
        for fresh in (False, True):  # away for seconds already; then tried afresh
            t0 = time.monotonic()
            with pytest.raises(ConnectionLost, match="no queue's cluster node could be reached"):
                claim_any([dead], timeout=None)
            assert (0.9 if fresh else 0) < time.monotonic() - t0 < 10
        client.close()
    finally:
        cluster.stop()
