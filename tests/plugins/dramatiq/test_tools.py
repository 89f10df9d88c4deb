"""belayq's command, dashboard views and metrics on Dramatiq queues (kind ``dramatiq``):
found through the registry, opened as recorded, with Dramatiq's message bodies."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import dramatiq
import redis

from belayq.discovery import find, list_queues, open_found
from belayq.kinds import tools_for
from belayq.metrics import QueueCollector
from belayq.web.console import message as message_detail
from belayq_dramatiq import Broker


def send(broker: Broker, key: str, delay: int | None = None) -> dramatiq.Message[Any]:
    return broker.enqueue(dramatiq.Message(queue_name="default", actor_name="mark",
                                           args=(key,), kwargs={}, options={}), delay=delay)


def test_the_tools_find_open_show_and_purge_dramatiq_queues(
    url: str, conn: redis.Redis
) -> None:
    broker = Broker(url=url, lease_ms=4000)
    broker.declare_queue("default")
    first = send(broker, "a")
    send(broker, "b")
    send(broker, "later", delay=60_000)
    assert [(f.kind, f.name) for f in list_queues(conn)] == [("dramatiq", "default")]
    found = find(conn, "default")
    q = open_found(conn, found)
    assert q.config.lease_ms == 4000 and q.stats()["ready"] == 2
    detail = message_detail(q, first.options["redis_message_id"])
    assert detail["state"] == "ready"
    assert detail["framework"]["actor_name"] == "mark"
    assert detail["framework"]["args"] == ["a"]
    tools = tools_for("dramatiq")
    assert tools is not None
    samples = {s.name: s.value for family in QueueCollector(lambda: [q]).collect()
               for s in family.samples if s.labels.get("kind") == "dramatiq"}
    # the oldest waiting message's age, read from its body's send time
    assert samples["belayq_oldest_ready_age_seconds"] >= 0
    assert samples["belayq_framework_failed"] == 0  # failed runs recorded (none here)
    assert samples["belayq_delayed"] == 1
    out = subprocess.run([sys.executable, "-m", "belayq", "stats", "--url", url, "default"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "dramatiq" in out.stdout, out.stderr
    purged = q.purge(delayed=False)  # the bodies are the core's payloads: they go too
    assert (purged.ready, purged.delayed) == (2, 0)
    assert conn.hlen("dramatiq:default.msgs") == 1  # the delayed message's, kept
    broker.close()
