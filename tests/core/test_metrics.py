"""The Prometheus metrics through a kill -9: ``belayq exporter`` is scraped while a consumer
process holds claims, after it is killed, and after the sweep puts its messages back; the
in-flight and reclaimed series move as they should, and every name and type follows the
Prometheus conventions, as prometheus_client's own parser reads them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer, free_port
from tests.conftest import flushed_client
from tests.support import wait_for

parser = pytest.importorskip("prometheus_client.parser")
ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 1_000

CONSUMER = textwrap.dedent("""
    import sys, time, redis
    from belayq import ReliableQueue
    q = ReliableQueue(redis.Redis(port=int(sys.argv[1])), "orders", lease_ms={lease})
    held = q.claim(timeout=5, count=5)
    print(len(held), flush=True)
    time.sleep(600)  # "working": the keeper extends the five leases until the kill
""").format(lease=LEASE_MS)


@pytest.fixture
def client(private_redis: RedisServer) -> Iterator[redis.Redis]:
    with flushed_client(private_redis) as c:
        yield c


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    samples = {}
    for family in parser.text_string_to_metric_families(body.decode()):
        if not family.name.startswith("belayq_"):
            continue
        for s in family.samples:
            if family.type == "histogram":
                assert family.name.endswith("_seconds"), family
                assert set(s.labels) <= {"kind", "queue", "le"}, s
                assert s.name[len(family.name):] in ("_bucket", "_sum", "_count", "_created"), s
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
                continue
            if family.name == "belayq_eviction_possible":  # the server's, not a queue's
                assert set(s.labels) == {"policy", "evicts"}, s
                continue
            assert set(s.labels) <= {"kind", "queue", "priority"}, s
            if family.type == "counter":
                assert s.name == family.name + "_total" or s.name.endswith("_created"), s
            else:
                assert family.type == "gauge" and not s.name.endswith("_total"), s
            if "age" in s.name:
                assert s.name.endswith("_seconds"), s
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_move_through_a_kill_9(client: redis.Redis, private_redis: RedisServer) -> None:
    q = ReliableQueue(client, "orders", keeper=False, lease_ms=LEASE_MS)
    q.publish_many([f"order-{i}".encode() for i in range(8)])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "belayq", "exporter", "--url", f"redis://127.0.0.1:"
         f"{private_redis.port}/0", "orders", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, text=True)
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, str(private_redis.port)],
                                env=env, stdout=subprocess.PIPE, text=True)
    orders = (("kind", "belayq"), ("queue", "orders"))
    ready_0 = (("kind", "belayq"), ("priority", "0"), ("queue", "orders"))
    try:
        assert consumer.stdout is not None and consumer.stdout.readline().strip() == "5"
        assert exporter.stdout is not None and "exporter on" in exporter.stdout.readline()
        m = wait_for(lambda: _try(scrape, port), 20, "the first scrape")
        assert m[("belayq_in_flight", orders)] == 5
        assert m[("belayq_ready", ready_0)] == 3
        assert m[("belayq_claimed_total", orders)] == 5
        assert m[("belayq_reclaimed_total", orders)] == 0
        time.sleep(LEASE_MS * 2 / 1000)  # the keeper renews: the leases stay young
        m = scrape(port)
        assert m[("belayq_in_flight", orders)] == 5
        assert m[("belayq_oldest_lease_age_seconds", orders)] < LEASE_MS / 1000
        consumer.send_signal(signal.SIGKILL)
        consumer.wait()
        time.sleep(LEASE_MS * 1.5 / 1000)  # no renewals: the oldest lease ages past its term
        m = scrape(port)
        assert m[("belayq_in_flight", orders)] == 5  # still held until a sweep
        assert m[("belayq_oldest_lease_age_seconds", orders)] > LEASE_MS / 1000
        assert q.sweep().reclaimed == 5  # what any live consumer's keeper does
        m = scrape(port)
        assert m[("belayq_in_flight", orders)] == 0
        assert m[("belayq_reclaimed_total", orders)] == 5
        assert m[("belayq_ready", ready_0)] == 8
        assert ("belayq_oldest_lease_age_seconds", orders) not in m
        assert 0 <= m[("belayq_oldest_ready_age_seconds", orders)] < 60
    finally:
        for p in (consumer, exporter):
            p.kill()
            p.wait()


def _try(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except OSError:
        return None
