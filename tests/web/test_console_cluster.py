"""The dashboard's console and the per-minute history on a Redis Cluster: every page and
action the console offers reads and acts on the node that holds the queue (a cluster client
refuses a pipeline of a command that names no key, such as TIME)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from belayq import ReliableQueue, rollups
from tests.conftest import make_client

from .test_dashboard import call

web = pytest.importorskip("belayq.web")


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Any:
    c = make_client(request, "cluster")
    yield c
    c.close()


def test_every_console_page_and_action_on_a_cluster(cluster: Any, served: Any) -> None:
    name = f"c-{uuid.uuid4().hex[:10]}"
    q = ReliableQueue(cluster, name, keeper=False, lease_ms=60_000, max_deliveries=1)
    q.publish_many([b'{"n": 1}', b"held"])
    later = q.publish(b"later", delay_ms=60_000)
    [broke] = q.claim(timeout=0)
    q.dead_letter(broke, "it broke")
    [held] = q.claim(timeout=0)
    dead = broke.id
    assert rollups.record_minute(q, None) is not None
    [minute] = cluster.hkeys(q.keys.rollups)
    zeros = " ".join("0" * len(rollups.COUNTERS))
    cluster.hset(q.keys.rollups, str(int(minute) - 1), zeros)  # the minute before: nothing
    with served(web.create_app(cluster, queues=[name])) as base:
        status, o = call(f"{base}/api/overview")
        assert status == 200, o
        [row] = o["queues"]
        assert "error" not in row, row
        assert (row["ready"], row["in_flight"], row["dead"]) == (0, 1, 1)
        api = f"{base}/api/queue/belayq/{name}"
        status, d = call(api)
        assert status == 200, d
        [one] = d["per_minute"]
        assert (one["published"], one["claimed"], one["dead_lettered"]) == (3, 2, 1)
        states = {}
        for mid in (later, held.id, dead):
            status, m = call(f"{api}/message/{mid}")
            assert status == 200, m
            states[mid] = m["state"]
        assert states == {later: "delayed", held.id: "in flight", dead: "dead"}
        status, found = call(f"{base}/api/search?id={held.id}")
        assert found["found"] == [{"kind": "belayq", "queue": name, "state": "in flight",
                                   "id": held.id}]
        assert call(f"{api}/pause", {}) == (200, {"paused": True})
        assert call(f"{api}/resume", {}) == (200, {"resumed": True})
        assert call(f"{api}/replay", {"ids": [dead]}) == (200, {"replayed": 1})
        status, d = call(api)
        assert [a["action"] for a in d["actions"]] == ["replay", "resume", "pause"]
    assert q.stats()["ready"] == 1
    q.close(release=False)
