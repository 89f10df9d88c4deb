"""The soak's census (``benchmarks.soaking.census``) judges what a server holds after a
drain: a key of one message with no documented cap is a leak, a capped record over its cap
is a leak, and the records kept on purpose within their caps are not."""

from __future__ import annotations

from belayq.embedded import RedisServer
from benchmarks.soaking import census

from .conftest import client_of, flushed_client

QUEUES = {"celery": "soak-celery", "rq": "soak-rq", "dramatiq": "soak-dramatiq"}


def verdicts(server: RedisServer) -> dict[str, str]:
    with client_of(server) as r:
        groups = census.classify(census.scan(r, QUEUES), census.context(r))
    return {g.pattern: g.verdict for g in groups}


def test_a_key_that_outlives_its_message_is_a_leak_and_capped_records_are_kept(
    private_redis: RedisServer,
) -> None:
    with flushed_client(private_redis) as r:
        r.set("{soak-celery}:trace:sk-c000001", b"ctx", px=86_400_000)  # a day, no count cap
        r.hset("{soak-celery}:stats", "acked", 1)
        r.rpush("{soak-celery}:actions", *[b"a"] * 10)
        r.hset("{soak-celery}:failures", "sk-c000002", b"{}")
        r.pexpire("{soak-celery}:failures", 3_600_000)
        r.hset("rq:job:sk-r000001", "status", "finished")
        r.expire("rq:job:sk-r000001", 500)
        r.hset("rq:job:sk-r000002", "status", "failed")  # no TTL: kept while RQ lists it
        r.zadd("rq:failed:soak-rq", {"sk-r000002": 1})
        r.hset("rq:job:sk-r000003", "status", "finished")  # no TTL, in no registry
    got = verdicts(private_redis)
    assert got["{<celery queue>}:trace:<task>"] == "LEAK"
    assert got["rq:job:<task>"] == "LEAK"  # sk-r000003
    assert got["{<celery queue>}:stats"] == "kept"
    assert got["{<celery queue>}:actions"] == "kept"
    assert got["{<celery queue>}:failures"] == "kept"
    assert got["rq:failed:<rq queue>"] == "kept"
    with client_of(private_redis) as r:
        r.delete("rq:job:sk-r000003")
    assert verdicts(private_redis)["rq:job:<task>"] == "kept"


def test_a_capped_record_over_its_cap_or_without_expiry_is_a_leak(
    private_redis: RedisServer,
) -> None:
    with flushed_client(private_redis) as r:
        r.rpush("{soak-rq}:actions", *[b"a"] * 201)  # the console keeps 200
        r.hset("{soak-rq}:failures", "x", b"{}")  # no expiry: failures expire after a week
        r.hset("{soak-rq}:memo", mapping={"r1": b"1", "r2": b"2"})
        r.zadd("{soak-rq}:memo:exp", {"r1": 1})  # r2 has no expiry
        r.hset("{soak-rq}:meta", "sk-r000001", b"state")  # a message's record, after the drain
        r.rpush("belayq:{soak-x}:history:done", b"h")  # no queue on record keeps a history
    got = verdicts(private_redis)
    assert got == {"{<rq queue>}:actions": "LEAK", "{<rq queue>}:failures": "LEAK",
                   "{<rq queue>}:memo": "LEAK", "{<rq queue>}:memo:exp": "kept",
                   "{<rq queue>}:meta": "LEAK", "belayq:{soak-x}:history:done": "LEAK"}


def test_a_history_list_is_kept_within_the_history_max_its_queue_recorded(
    private_redis: RedisServer,
) -> None:
    from belayq import ReliableQueue

    with flushed_client(private_redis) as r:
        q = ReliableQueue(r, "soak-h", history_max=3)
        r.rpush(q.keys.history_done, *[b"h"] * 3)
        assert verdicts(private_redis)["belayq:{soak-h}:history:done"] == "kept"
        r.rpush(q.keys.history_done, b"h")
        assert verdicts(private_redis)["belayq:{soak-h}:history:done"] == "LEAK"
        q.close()


def test_a_queue_s_lead_is_kept_while_it_expires_within_the_recorded_lease(
    private_redis: RedisServer,
) -> None:
    from belayq import ReliableQueue

    with flushed_client(private_redis) as r:
        q = ReliableQueue(r, "soak-l", lease_ms=5000)
        q.publish(b"later", delay_ms=600_000)  # a queue leads only while something waits
        assert q.lead()
        assert verdicts(private_redis)["belayq:{soak-l}:lead"] == "kept"
        r.persist(q.keys.lead)  # a lead that would never lapse
        assert verdicts(private_redis)["belayq:{soak-l}:lead"] == "LEAK"
        q.close()


def test_a_task_is_lost_when_it_reached_neither_its_end_nor_its_framework_s_records(
    private_redis: RedisServer,
) -> None:
    import json

    from benchmarks.soaking.ledger import LEDGER
    from benchmarks.soaking.report import judge_tasks

    sent = {"sk-c1": ("celery", "ok", 0.0), "sk-c2": ("celery", "ok", 0.0),
            "sk-c5": ("celery", "fail", 0.0), "sk-d3": ("dramatiq", "dead", 0.0),
            "sk-r4": ("rq", "fail", 0.0), "sk-r6": ("rq", "dead", 0.0)}
    with flushed_client(private_redis) as r:
        ends = [["sk-c1", 1, 1, "ok"], ["sk-c5", 1, 1, "failed"], ["sk-r4", 1, 1, "failed"]]
        ends += [["sk-d3", n, 1, "failed"] for n in (1, 2, 3)]  # ran out of retries...
        r.rpush(LEDGER + "ends", *[json.dumps(e) for e in ends])
        r.zadd("rq:failed:soak-rq", {"sk-r4": 1})  # ...but sk-d3 is in no dead letters
        t = judge_tasks(sent, r, r, QUEUES, final=True)
        waiting = judge_tasks(sent, r, r, QUEUES, final=False).waiting
    assert sorted(t.lost) == ["sk-c2", "sk-d3", "sk-r6"]
    assert dict(t.by_end) == {"done": 1, "failed": 2}
    assert sorted(waiting) == ["sk-c2", "sk-r6"]  # while draining, sk-d3 may be on its way


def test_a_job_meant_to_succeed_that_rq_failed_is_reported_not_taken_for_lost(
    private_redis: RedisServer,
) -> None:
    from benchmarks.soaking.report import judge_tasks

    sent = {"sk-r7": ("rq", "slow", 0.0), "sk-r8": ("rq", "ok", 0.0)}
    with flushed_client(private_redis) as r:
        r.zadd("rq:failed:soak-rq", {"sk-r7": 1})  # its work horse was killed, say
        t = judge_tasks(sent, r, r, QUEUES, final=True)
    assert t.failed_unplanned == ["sk-r7"]
    assert t.lost == ["sk-r8"]


def test_writes_during_a_read_are_named_and_a_read_that_writes_nothing_names_none(
    private_redis: RedisServer,
) -> None:
    with flushed_client(private_redis) as r:
        r.set("a", 1)
        r.set("b", 1)
        r.set("c", 1)
        assert census.writes_during(r, lambda: r.get("a")) == {
            "created": [], "changed": [], "deleted": []}
        got = census.writes_during(r, lambda: (r.set("a", 2), r.delete("b"), r.set("d", 1)))
        assert (got["created"], got["changed"]) == (["d"], ["a"])
        assert [k.split(" ")[0] for k in got["deleted"]] == ["b"]
