"""Upgrading a schema-1 queue in place (``belayq upgrade``; its older spelling ``python -m belayq
upgrade --queue Q --rq`` is what the command test runs).

The schema-1 keys are written here by hand, in the layout belayq 0.1's keys.py and Lua
scripts used: one hash per message (``m:<id>`` with p, l, n, t, u, e, d), claimed entries in
the processing list with a lease, a dead-letter list, a token counter ``seq`` in stats.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import redis

from belayq import ReliableQueue, SchemaMismatch
from belayq.upgrade import upgrade_schema1


def _write_schema1(r: redis.Redis, base: str, levels: list[str]) -> None:
    p = r.pipeline()
    p.hset(base + "stats", mapping={"schema": 1, "seq": 7, "published": 5, "acked": 1})
    # waiting: a fresh id on level 1 and a redelivered one on level 2
    p.hset(base + "m:fresh", mapping={"p": b"fresh", "l": 1, "u": 1})
    p.lpush(levels[0], "fresh")
    p.hset(base + "m:again", mapping={"p": b"again", "l": 2, "n": 2, "e": "boom", "u": 1})
    p.lpush(levels[1], "again")
    # claimed by a consumer that is stopped now: processing + lease + token
    p.hset(base + "m:held", mapping={"p": b"held", "l": 1, "n": 3, "t": "7", "u": 1})
    p.lpush(base + "processing", "held")
    p.zadd(base + "leases", {"held": 10**13})
    # delayed and dead
    p.hset(base + "m:later", mapping={"p": b"later", "l": 1, "u": 1})
    sec, usec = r.time()
    p.zadd(base + "delayed", {"later": sec * 1000 + usec // 1000 + 5_000})
    p.hset(base + "m:gone", mapping={"p": b"gone", "l": 1, "n": 5, "e": "lease expired", "d": 42})
    p.lpush(base + "dead", "gone")
    # schema 1's short-lived keys
    p.set(base + "sweep", 1, px=60_000)
    p.set(base + "r:abc", "1:1", px=60_000)
    p.set(base + "dedup:order-1", "fresh", px=60_000)
    p.execute()


def test_schema1_queue_is_refused_until_upgraded_then_everything_is_there(
    r: redis.Redis, qname: str
) -> None:
    base = f"belayq:{{{qname}}}:"
    levels = [base + "ready"] + [f"{base}ready:{i}" for i in range(1, 10)]
    _write_schema1(r, base, levels)
    with pytest.raises(SchemaMismatch, match="upgrade"):
        ReliableQueue(r, qname, keeper=False)

    counts = upgrade_schema1(r, qname)
    assert counts == {"returned": 1, "messages": 5, "dead": 1}
    assert not r.keys(base.replace("{", "\\{").replace("}", "\\}") + "m:*")
    assert not any(r.exists(base + k) for k in ("sweep", "r:abc", "dedup:order-1"))

    q = ReliableQueue(r, qname, keeper=False, lease_ms=1_000)
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["delayed"], s["dead"]) == (3, 0, 1, 1)
    assert "seq" not in s and s["published"] == 5
    got = q.claim(timeout=0, count=10)
    # the interrupted claim first (head of level 1), then level 1, then level 2
    assert [(d.id, d.payload) for d in got] == [
        ("held", b"held"), ("fresh", b"fresh"), ("again", b"again")
    ]
    # the interrupted delivery does not count as a run; earlier deliveries do
    assert {d.id: (d.deliveries, d.attempts) for d in got} == {
        "held": (4, 3), "fresh": (1, 1), "again": (3, 3)
    }
    assert q.ack_many(got) == [True, True, True]
    [dead] = q.dead_letters()
    assert (dead.id, dead.payload, dead.reason, dead.deliveries) == (
        "gone", b"gone", "lease expired", 5
    )
    assert q.replay_dead() == 1
    q._scripts.skew_ms += 10_000
    later = q.claim(timeout=0, count=10)
    assert sorted(d.payload for d in later) == [b"gone", b"later"]
    with pytest.raises(SchemaMismatch, match="not 1"):
        upgrade_schema1(r, qname)


def test_upgrade_command_for_an_rq_queue(redis_server: Any, qname: str) -> None:
    r = redis.Redis(port=redis_server.port)
    base = f"{{rq:queue:{qname}}}:"
    p = r.pipeline()
    p.hset(base + "stats", mapping={"schema": 1, "seq": 3})
    p.rpush(f"rq:queue:{qname}", "job-1")
    p.hset(base + "m:job-2", mapping={"p": b"job-2", "l": 1, "n": 1, "t": "3"})
    p.lpush(base + "processing", "job-2")
    p.zadd(base + "leases", {"job-2": 10**13})
    p.execute()
    out = subprocess.run(
        [sys.executable, "-m", "belayq", "upgrade", "--url", redis_server.url, "--queue",
         qname, "--rq"], capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "1 claim(s) put back" in out.stdout
    q = ReliableQueue(r, qname, ready_key=f"rq:queue:{qname}", payload_in_list=True,
                      ready_head="left", keeper=False)
    assert [d.payload for d in q.claim(timeout=0, count=5)] == [b"job-2", b"job-1"]
    again = subprocess.run(
        [sys.executable, "-m", "belayq", "upgrade", "--url", redis_server.url, "--queue",
         qname, "--rq"], capture_output=True, text=True, timeout=60,
    )
    # Run again: nothing to do, and a deploy that runs it every time goes on.
    assert again.returncode == 0 and "already at schema 2" in again.stdout, again.stderr
