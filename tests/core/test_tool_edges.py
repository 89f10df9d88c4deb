"""The operator's tools at the edges: ``belayq`` and the exporter act only on queues, find
them without scanning the keyspace, are not thrown by other applications' keys, list the
queues only stock producers fill, honour ``--kind``, and label every series with its kind."""

from __future__ import annotations

import json

import pytest
import redis

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from belayq.keys import kombu_layout, rq_layout
from tests.core.conftest import run, scrape_once


def listed(capsys: pytest.CaptureFixture[str], url: str, *extra: str) -> set[tuple[str, str]]:
    code, out, err = run(capsys, "queues", "--url", url, "--json", *extra)
    assert code == 0, err
    return {(r["kind"], r["queue"]) for r in map(json.loads, out.splitlines())}


def dumps(client: redis.Redis) -> dict[bytes, bytes | None]:
    return {k: client.dump(k) for k in client.keys("*")}


def test_drop_and_purge_refuse_keys_that_are_no_queue(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client.hset("users", mapping={"42": "ada", "43": "grace"})
    client.rpush("audit-log", "login", "logout")
    ReliableQueue(client, "emails", keeper=False).publish(b"x")
    before = dumps(client)
    for argv in (("drop", "users", "--yes"), ("purge", "audit-log", "--yes"),
                 ("drop", "users", "--kind", "kombu", "--yes"),
                 ("purge", "audit-log", "--kind", "rq", "--yes"),
                 ("stats", "users")):
        code, out, err = run(capsys, argv[0], "--url", url, *argv[1:])
        assert code == 2 and "no queue" in err and not out, argv
        assert len(err.strip().splitlines()) == 1
    assert dumps(client) == before


def test_other_applications_keys_do_not_break_the_listing(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client.zadd("{user:42}:stats", {"logins": 3})
    client.set("{orders}:stats", "not a hash")
    client.zadd("belayq:{lookalike}:stats", {"x": 1})
    ReliableQueue(client, "emails", keeper=False).publish(b"x")
    assert listed(capsys, url) == {("belayq", "emails")}
    code, out, err = run(capsys, "watch", "--url", url, "--count", "1", "--interval", "0")
    assert code == 0 and "emails" in out, err


def _commands(client: redis.Redis) -> dict[str, int]:
    return {name: int(stat["calls"]) for name, stat in client.info("commandstats").items()}


def test_listing_costs_the_same_with_many_unrelated_keys(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a", "b", "c"):
        ReliableQueue(client, name, keeper=False).publish(b"x")

    def one_listing() -> dict[str, int]:
        client.config_resetstat()
        assert len(listed(capsys, url)) == 3
        calls = _commands(client)
        calls.pop("cmdstat_config|resetstat", None)
        calls.pop("cmdstat_config", None)
        calls.pop("cmdstat_info", None)
        return calls

    empty = one_listing()
    pipe = client.pipeline(transaction=False)
    for i in range(30_000):
        pipe.set(f"rq:job:{i:08d}", "x")
        if i % 5_000 == 4_999:
            pipe.execute()
    pipe.execute()
    full = one_listing()
    assert "cmdstat_scan" not in full and "cmdstat_keys" not in full
    assert full == empty


def test_queues_only_stock_producers_fill_are_listed(
    client: redis.Redis, url: str, server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    import rq
    from kombu import Connection, Exchange, Queue

    rq.Queue("reports", connection=client).enqueue("builtins.print", "hi")
    exchange = Exchange("celery", type="direct")
    with Connection(f"redis://127.0.0.1:{server.port}/0") as conn:  # the stock transport
        producer = conn.Producer()
        producer.publish({"x": 1}, exchange=exchange, routing_key="legacy",
                         declare=[Queue("legacy", exchange, routing_key="legacy")])
    assert listed(capsys, url) == {("rq", "reports"), ("kombu", "legacy")}
    code, out, err = run(capsys, "stats", "--url", url, "legacy", "--json")
    assert code == 0 and json.loads(out)["ready"] == 1 and json.loads(out)["kind"] == "kombu"


def test_kind_selects_what_is_listed_watched_and_exported(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ReliableQueue(client, "emails", keeper=False)
    ReliableQueue(client, "celery", keeper=False, **kombu_layout("celery"))  # type: ignore[arg-type]
    ReliableQueue(client, "default", keeper=False, **rq_layout("default"))  # type: ignore[arg-type]
    assert listed(capsys, url, "--kind", "rq") == {("rq", "default")}
    assert listed(capsys, url, "--kind", "kombu") == {("kombu", "celery")}
    code, out, _ = run(capsys, "watch", "--url", url, "--kind", "belayq", "--count", "1",
                       "--interval", "0")
    assert code == 0 and "emails" in out and "celery" not in out and "default" not in out


def test_same_named_queues_of_two_kinds_are_two_series(client: redis.Redis, url: str) -> None:
    own = ReliableQueue(client, "celery_bulk", keeper=False)
    own.publish(b"x")
    kombu = ReliableQueue(client, "celery_bulk", keeper=False, lease_ms=20_000,
                          **kombu_layout("celery_bulk"))  # type: ignore[arg-type]
    kombu.publish_many([b"y"] * 3)
    kombu.claim(timeout=0)
    m = scrape_once(url)
    assert m['belayq_ready{kind="belayq",priority="0",queue="celery_bulk"}'] == 1
    assert m['belayq_ready{kind="kombu",priority="0",queue="celery_bulk"}'] == 2
    # Measured against the queue's own 20 s lease, a lease renewed just now is young; against
    # belayq's 30 s default it would read 10 s old.
    assert m['belayq_oldest_lease_age_seconds{kind="kombu",queue="celery_bulk"}'] < 5


def test_an_exporter_of_a_kind_exports_that_kind_only(client: redis.Redis, url: str) -> None:
    ReliableQueue(client, "emails", keeper=False)
    ReliableQueue(client, "default", keeper=False, **rq_layout("default"))  # type: ignore[arg-type]
    scraped = scrape_once(url, "--kind", "rq")
    kinds = {series.split('kind="')[1].split('"')[0] for series in scraped
             if 'kind="' in series}
    assert kinds == {"rq"}
    # the server's own series, labelled by its policy, not by a queue
    assert [s for s in scraped if 'kind="' not in s] == [
        'belayq_eviction_possible{evicts="nothing",policy="noeviction"}']




def test_a_queue_that_cannot_be_read_is_a_line_with_its_error_not_the_end_of_the_listing(
    client: redis.Redis, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ReliableQueue(client, "emails", keeper=False).publish(b"x")
    broken = ReliableQueue(client, "newer", keeper=False)
    client.hset(broken.keys.stats, "schema", 99)  # as a later belayq would write it
    code, out, err = run(capsys, "queues", "--url", url, "--json")
    got = {r["queue"]: r for r in map(json.loads, out.splitlines())}
    assert code == 0, err
    assert got["emails"]["ready"] == 1 and "SchemaMismatch" in got["newer"]["error"]
    m = scrape_once(url)
    assert m['belayq_ready{kind="belayq",priority="0",queue="emails"}'] == 1
    assert not any('queue="newer"' in series for series in m)
