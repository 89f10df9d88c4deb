"""The dashboard applies each queue's record as it stands at each request, never what it
read when it first opened the queue: a rolling restart's new limits govern its next sweep;
a pause from it goes into the control history and sends its event, as the CLI's does; and
on a full server the action log is best-effort, never turning a done pause into an error."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.keys import dramatiq_layout
from tests.conftest import any_binary, client_of
from tests.web.test_dashboard import call

web = pytest.importorskip("belayq.web")


def test_the_dashboards_sweep_applies_the_limits_recorded_now(
    client: redis.Redis, served: Any
) -> None:
    ReliableQueue(client, "jobs", keeper=False, max_deliveries=3, dead_letter_max=1_000)
    with served(web.create_app(client)) as base:
        api = f"{base}/api/queue/belayq/jobs"
        assert call(api)[0] == 200 and call(f"{base}/api/overview")[0] == 200  # opened once
        # A rolling restart raises the limits: 20 runs, 100,000 dead letters.
        q = ReliableQueue(client, "jobs", keeper=False, max_deliveries=20,
                          dead_letter_max=100_000, lease_ms=300)
        q.publish(b"x")
        for _ in range(3):
            [d] = q.claim(timeout=0)
            assert q.nack(d, delay_ms=0) == "ready"
        [d] = q.claim(timeout=0)  # its 4th of 20 runs, whose holder dies
        assert d.deliveries == 4
        time.sleep(0.4)
        status, swept = call(f"{api}/sweep", {})
        assert status == 200 and (swept["reclaimed"], swept["dead_lettered"]) == (1, 0)
        s = q.stats()
        assert (s["ready"], s["dead"]) == (1, 0)
        status, detail = call(api)
        assert detail["lease_ms"] == 300  # as recorded now
        q.publish_many([b"dead"] * 1_001)  # more dead letters than the old cap
        for d in q.claim(timeout=0, count=1_001):
            q.dead_letter(d, "bad")
        assert q.stats()["dead"] == 1_001
        assert call(f"{api}/replay", {"all": True, "confirm": "jobs"}) == (200, {"replayed": 1_001})


def test_a_pause_from_the_dashboard_is_in_the_control_history_and_sends_its_event(
    client: redis.Redis, served: Any
) -> None:
    worker = ReliableQueue(client, "jobs", keeper=False, history_max=10, events=True)
    with served(web.create_app(client)) as base, worker.events() as stream:
        api = f"{base}/api/queue/belayq/jobs"
        assert call(f"{api}/pause", {}) == (200, {"paused": True})
        event = stream.get(timeout=5)
        assert event is not None and event.kind == "paused"
        assert call(f"{api}/resume", {}) == (200, {"resumed": True})
        event = stream.get(timeout=5)
        assert event is not None and event.kind == "resumed"
    control = worker.history("control", 10)
    assert [h.outcome for h in control] == ["resumed", "paused"]
    assert all(h.reason.startswith("dashboard ") for h in control)


@pytest.fixture
def full_client() -> Iterator[redis.Redis]:
    """A client of a server of the test's own, which it fills (maxmemory, noeviction)."""
    with RedisServer(any_binary(), args=["--maxmemory-policy", "noeviction"]) as server, \
            client_of(server) as c:
        yield c


def test_on_a_full_server_a_done_pause_answers_done_and_the_log_is_best_effort(
    full_client: redis.Redis, served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = full_client
    worker = ReliableQueue(client, "jobs", keeper=False, history_max=10)
    worker.publish(b"x")
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", max(1, used - 200_000))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("probe", "x")
    try:
        with served(web.create_app(client)) as base, \
                caplog.at_level(logging.WARNING, logger="belayq"):
            api = f"{base}/api/queue/belayq/jobs"
            assert call(f"{api}/pause", {}) == (200, {"paused": True})
            assert worker.stats()["paused"] == 1
            assert any("action log" in r.getMessage() for r in caplog.records)
            assert call(f"{api}/resume", {}) == (200, {"resumed": True})
    finally:
        client.config_set("maxmemory", 0)
    assert worker.stats()["paused"] == 0


def test_two_apps_queues_of_one_name_are_two_lines_and_two_details(
    client: redis.Redis, served: Any
) -> None:
    mine = ReliableQueue(client, "default", keeper=False, **dramatiq_layout("default"))
    theirs = ReliableQueue(client, "default", keeper=False,
                           **dramatiq_layout("default", namespace="app2"))
    mine.publish(b"a")
    theirs.publish_many([b"b", b"c"])
    with served(web.create_app(client)) as base:
        status, o = call(f"{base}/api/overview")
        assert status == 200
        assert sorted((q.get("namespace", ""), q["ready"]) for q in o["queues"]
                      if q["kind"] == "dramatiq") == [("", 1), ("app2", 2)]
        api = f"{base}/api/queue/dramatiq/default"
        assert call(api)[1]["stats"]["ready"] == 1
        assert call(f"{api}?namespace=app2")[1]["stats"]["ready"] == 2
        assert call(f"{api}?namespace=app3")[0] == 404
