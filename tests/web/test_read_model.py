"""One read model for every tool: ``belayq queues`` (and ``inspect``), the dashboard's
overview and queue page, and the exporter show the same numbers for a queue, and each
equals what its framework's own tools say: RQ's scheduled jobs are delayed, jobs RQ's
producers pushed are published, "out" is what left the queue finished (never a nack that
put a message back), the history's failed runs are the framework's, and "running for" is
the time since a claim, not since its lease was renewed."""

from __future__ import annotations

import contextlib
import io
import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from rq import Queue as StockQueue

import belayq_rq
from belayq import ReliableQueue, ShardedQueue, rollups
from belayq.cli import main
from belayq.discovery import list_queues, open_found
from belayq.keys import dramatiq_layout, kombu_layout
from belayq.metrics import QueueCollector
from tests.plugins.rq import jobs

from .test_dashboard import call

web = pytest.importorskip("belayq.web")
parser = pytest.importorskip("prometheus_client.parser")

#: The numbers every surface shows for a queue.
SHARED = ("ready", "delayed", "in_flight", "dead", "failed", "published", "acked", "out")


def port_of(client: redis.Redis) -> int:
    return int(client.connection_pool.connection_kwargs["port"])


def cli(client: redis.Redis, *args: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*args, "--url", f"redis://127.0.0.1:{port_of(client)}/0", "--json"])
    assert code == 0, out.getvalue()
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def exported(client: redis.Redis) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float],
                                           dict[str, str]]:
    """The exporter's samples and each family's HELP."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(QueueCollector(lambda: [open_found(client, f)
                                              for f in list_queues(client)]))
    samples, helps = {}, {}
    for family in parser.text_string_to_metric_families(generate_latest(registry).decode()):
        helps[family.name] = family.documentation
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, helps


def surfaces(client: redis.Redis, base: str, kind: str, name: str) -> dict[str, dict[str, Any]]:
    """The numbers of queue ``kind``/``name`` as each tool shows them."""
    [line] = [r for r in cli(client, "queues") if (r["kind"], r["queue"]) == (kind, name)]
    status, overview = call(f"{base}/api/overview")
    assert status == 200
    [row] = [r for r in overview["queues"] if (r["kind"], r["queue"]) == (kind, name)]
    status, detail = call(f"{base}/api/queue/{kind}/{name}")
    assert status == 200
    samples, _ = exported(client)
    lab = (("kind", kind), ("queue", name))
    gauges = {n: samples.get((f"belayq_{n}", lab)) for n in ("delayed", "in_flight", "dead")}
    gauges["ready"] = sum(v for (n, labels), v in samples.items()
                          if n == "belayq_ready" and dict(labels).get("queue") == name
                          and dict(labels).get("kind") == kind)
    gauges["failed"] = samples.get(("belayq_framework_failed", lab))
    gauges["published"] = samples.get(("belayq_published_total", lab))
    gauges["acked"] = samples.get(("belayq_acked_total", lab))
    gauges["out"] = samples.get(("belayq_out_total", lab))
    gauges["running_for_s"] = samples.get(("belayq_running_for_seconds", lab))
    return {"cli": line, "overview": row, "card": detail["counts"], "exporter": gauges}


def agree(seen: dict[str, dict[str, Any]], **expected: Any) -> None:
    for surface, numbers in seen.items():
        for name, value in expected.items():
            assert numbers[name] == value, (surface, name, numbers)


def test_rq_scheduled_jobs_count_as_delayed_on_every_surface(client: redis.Redis,
                                                           served: Any) -> None:
    q = belayq_rq.Queue("reports", connection=client)
    q.enqueue(jobs.add, 1, 2)
    q.enqueue_in(timedelta(minutes=5), jobs.add, 3, 4)
    q.enqueue_at(datetime.now(timezone.utc) + timedelta(minutes=10), jobs.add, 5, 6)
    scheduled = client.zcard("rq:scheduled:reports")
    assert scheduled == 2 == len(q.scheduled_job_registry)
    with served(web.create_app(client)) as base:
        seen = surfaces(client, base, "rq", "reports")
        agree(seen, ready=1, delayed=scheduled, in_flight=0, dead=0, failed=0)
        status, detail = call(f"{base}/api/queue/rq/reports")
        assert len(detail["delayed"]) == scheduled  # the page's list says the same


def test_rq_jobs_count_as_published_at_enqueue_and_stock_ones_at_their_first_claim(
        client: redis.Redis, served: Any) -> None:
    q = belayq_rq.Queue("imports", connection=client)
    for i in range(4):
        q.enqueue(jobs.add, i, i)
    StockQueue("imports", connection=client).enqueue(jobs.add, 9, 9)  # a stock producer
    with served(web.create_app(client)) as base:
        agree(surfaces(client, base, "rq", "imports"), ready=5, published=4)  # no worker
        q.enqueue(jobs.add, 5, 5)
        time.sleep(0.6)
        seen = surfaces(client, base, "rq", "imports")
        agree(seen, ready=6, published=5)
        assert seen["overview"]["in_per_min"] > 0  # a backlog with no worker: in, not out
        worker = belayq_rq.SimpleWorker([q], connection=client)
        assert worker.work(burst=True)
        seen = surfaces(client, base, "rq", "imports")
        agree(seen, ready=0, published=6, acked=6, out=6, failed=0)  # each counted once
        row = seen["overview"]
        assert row["in_per_min"] > 0 and row["out_per_min"] > 0


def test_failed_runs_in_the_history_are_the_frameworks_not_the_nacks(
        client: redis.Redis) -> None:
    q = belayq_rq.Queue("payments", connection=client)
    for i in range(2):
        q.enqueue(jobs.add, i, 1)
    failing = [q.enqueue(jobs.fail) for _ in range(3)]
    core = q.belayq()
    seconds, _ = client.time()
    before = int(seconds) // 60 - 1  # counters were all 0 a minute ago
    client.hset(core.keys.rollups, str(before), " ".join("0" for _ in rollups.SNAPSHOT))
    assert belayq_rq.SimpleWorker([q], connection=client).work(burst=True)
    assert all(job.get_status(refresh=True) == "failed" for job in failing)
    assert rollups.record_minute(core, None) is not None
    [minute] = [row for row in rollups.history(core) if row["t"] > before * 60_000]
    assert (minute["acked"], minute["nacked"]) == (5, 0)  # RQ acks a failed job too
    assert (minute["failed"], minute["completed"]) == (3, 2)
    assert minute["failed"] == len(q.failed_job_registry)


@pytest.mark.parametrize(("layout", "completed"), [(kombu_layout, 2), (dramatiq_layout, 3)])
def test_completed_runs_leave_out_the_failed_runs_where_each_framework_settles_them(
        client: redis.Redis, layout: Any, completed: int) -> None:
    # One minute: 5 acked, 3 runs raised, 1 dead letter. Celery acks every failed run; a
    # Dramatiq message's last failed run is dead-lettered instead (not acked).
    q = ReliableQueue(client, "minute", keeper=False, **layout("minute"))
    seconds, _ = client.time()
    now = int(seconds) // 60
    counts = {"acked": 5, "failed": 3, "dead_lettered": 1}
    client.hset(q.keys.rollups, mapping={
        str(now - 1): " ".join("0" for _ in rollups.SNAPSHOT),
        str(now): " ".join(str(counts.get(n, 0)) for n in rollups.SNAPSHOT)})
    [minute] = rollups.history(q)
    assert (minute["failed"], minute["completed"]) == (3, completed)


def test_out_counts_what_left_finished_never_a_nack(client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "retried", keeper=False, max_deliveries=2)
    q.publish(b"first")
    [d] = q.claim(timeout=0)
    q.ack(d)
    with served(web.create_app(client)) as base:
        call(f"{base}/api/overview")  # the rates' first look
        q.publish_many([b"ok-1", b"ok-2", b"bad"])
        for _ in range(2):  # every run fails: each nack puts the messages back
            for d in q.claim(timeout=0, count=3):
                q.nack(d)
        # The second nack of each dead-lettered it (counted as nacked and dead-lettered).
        assert (q.stats()["dead"], q.stats()["nacked"], q.stats()["dead_lettered"]) == (3, 6, 3)
        assert q.replay_dead([q.dead_letters()[0].id]) == 1
        [d] = q.claim(timeout=0)
        q.ack(d)
        time.sleep(0.6)
        seen = surfaces(client, base, "belayq", "retried")
        # 3 dead-lettered once each, 1 acked after its replay: 4 out, whatever the nacks
        agree(seen, ready=0, dead=2, acked=2, out=5, published=4)
        row = seen["overview"]
        assert row["out_per_min"] == pytest.approx(row["in_per_min"] * 4 / 3, rel=0.01)


def test_running_for_is_the_time_since_the_claim_not_since_the_renewal(
        client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "slow", keeper=False, lease_ms=5_000)
    q.publish(b"long job")
    [d] = q.claim(timeout=0)
    time.sleep(1.5)
    assert q.extend([d]) == [True]  # the keeper's renewal: the lease is fresh again
    with served(web.create_app(client)) as base:
        seen = surfaces(client, base, "belayq", "slow")
        for surface, numbers in seen.items():
            assert 1.5 <= numbers["running_for_s"] < 10, (surface, numbers)
        samples, _ = exported(client)
        lease_age = samples[("belayq_oldest_lease_age_seconds",
                             (("kind", "belayq"), ("queue", "slow")))]
        assert lease_age < 1.0  # what "oldest lease" showed: since the renewal
        [claim] = cli(client, "inspect", "slow")
        assert 1.5 <= claim["running_for_s"] < 10
        status, detail = call(f"{base}/api/queue/belayq/slow")
        assert 1.5 <= detail["in_flight"][0]["running_for_s"] < 10
    q.ack(d)
    assert cli(client, "queues")[0]["running_for_s"] is None  # nothing runs


def test_a_prefetched_claim_not_started_is_not_running(client: redis.Redis) -> None:
    q = ReliableQueue(client, "prefetched", keeper=False, claim_starts=False)
    q.publish(b"x")
    [d] = q.claim(timeout=0)
    time.sleep(0.3)
    [claim] = cli(client, "inspect", "prefetched")
    assert (claim["started"], claim["running_for_s"]) == (False, None)
    assert cli(client, "queues")[0]["running_for_s"] is None
    assert q.report_started([(d.id, d.token)]) == [True]
    [claim] = cli(client, "inspect", "prefetched")
    assert claim["started"] and claim["running_for_s"] >= 0.3  # since the claim


def test_exporter_help_and_priority_series(client: redis.Redis) -> None:
    plain = ReliableQueue(client, "plain", keeper=False)
    plain.publish(b"a")
    urgent = ReliableQueue(client, "urgent", keeper=False)
    urgent.publish(b"b", priority=5)
    samples, helps = exported(client)
    ready = {(dict(labels)["queue"], dict(labels)["priority"]): v
             for (name, labels), v in samples.items() if name == "belayq_ready"}
    assert ready == {("plain", "0"): 1.0, ("urgent", "0"): 0.0, ("urgent", "5"): 1.0}
    text = helps["belayq_framework_failed"]
    assert all(f in text for f in ("RQ", "Celery", "Dramatiq")) and "(RQ's)" not in text


def test_a_sharded_queue_is_read_over_its_shards(client: redis.Redis, served: Any) -> None:
    q = ShardedQueue(client, "spread", shards=3, keeper=False)
    try:
        q.publish_many([b"m"] * 6)
        q.publish(b"later", delay_ms=600_000)
        [d] = q.claim(timeout=0)
        time.sleep(0.3)
        with served(web.create_app(client)) as base:
            seen = surfaces(client, base, "belayq", "spread")
        agree(seen, ready=5, delayed=1, in_flight=1, published=7, out=0)
        assert all(n["running_for_s"] >= 0.3 for n in seen.values()), seen
        q.ack(d)
    finally:
        q.close(release=False)


def _rq_queue_with_every_registry(client: redis.Redis) -> tuple[belayq_rq.Queue, Any]:
    """An RQ queue with a waiting job, a scheduled one, a failed one, and the expired
    entries RQ's cleanup would delete: a failed job whose failure_ttl ran out and a started
    entry whose worker is long gone."""
    q = belayq_rq.Queue("rqq", connection=client)
    failing = q.enqueue(jobs.fail)
    assert belayq_rq.SimpleWorker([q], connection=client).work(burst=True)
    assert failing.get_status(refresh=True) == "failed"
    q.enqueue(jobs.add, 1, 2)
    q.enqueue_in(timedelta(minutes=5), jobs.add, 3, 4)
    client.zadd("rq:failed:rqq", {"expired-job-1": 1000})
    client.zadd("rq:wip:rqq", {"gone-job:exec-1": 1000})
    return q, failing


def test_reading_an_rq_queue_writes_nothing_on_any_surface(client: redis.Redis,
                                                           served: Any) -> None:
    _, failing = _rq_queue_with_every_registry(client)

    def snapshot() -> dict[bytes, tuple[bytes | None, int]]:
        return {k: (client.dump(k), int(client.pttl(k)) // 60_000) for k in client.keys("*")}

    before = snapshot()
    with served(web.create_app(client)) as base:
        surfaces(client, base, "rq", "rqq")
        cli(client, "delayed", "rqq")
        assert call(f"{base}/api/queue/rq/rqq/message/{failing.id}")[0] == 200
        assert call(f"{base}/api/search?id={failing.id}")[0] == 200
    after = snapshot()
    changed = sorted(k.decode() for k in set(before) | set(after)
                     if before.get(k) != after.get(k))
    assert changed == []
    assert client.zscore("rq:failed:rqq", "expired-job-1") == 1000


def test_rq_failed_counts_what_rqs_registry_count_answers(client: redis.Redis,
                                                          served: Any) -> None:
    q, failing = _rq_queue_with_every_registry(client)
    with served(web.create_app(client)) as base:
        seen = surfaces(client, base, "rq", "rqq")
        status, detail = call(f"{base}/api/queue/rq/rqq")
    shown = detail["framework_failed"]
    rq_count = q.failed_job_registry.count  # RQ's own answer (it cleans up first)
    assert rq_count == 1
    agree(seen, failed=rq_count)
    assert shown["count"] == rq_count and [r["id"] for r in shown["rows"]] == [failing.id]


def test_an_rq_job_is_found_only_in_the_queue_it_was_enqueued_on(client: redis.Redis,
                                                                 served: Any) -> None:
    job = belayq_rq.Queue("mail", connection=client).enqueue(jobs.add, 1, 2)
    belayq_rq.Queue("sms", connection=client).enqueue(jobs.add, 3, 4)
    with served(web.create_app(client)) as base:
        status, answer = call(f"{base}/api/search?id={job.id}")
        assert status == 200, answer
        assert [(f["kind"], f["queue"]) for f in answer["found"]] == [("rq", "mail")]
        assert call(f"{base}/api/queue/rq/mail/message/{job.id}")[0] == 200
        assert call(f"{base}/api/queue/rq/sms/message/{job.id}")[0] == 404
