"""``publish_result(before=...)``: an adapter's own write (a body under the id it publishes)
and the publish in one round trip, in one transaction (MULTI/EXEC): refused as it is
queued (the ACL, an unknown command), neither is applied; a script the server lost runs
again alone; a bad ``before`` is refused before anything is sent. The full server (OOM) is
in ``test_memory.py``."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from belayq import ConfigError, NotPermitted, ReliableQueue


def calls(client: redis.Redis, command: str) -> int:
    """How many times the server has run ``command`` (INFO commandstats)."""
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def bodies(q: ReliableQueue) -> str:
    return f"{q.name}-bodies"


def test_the_write_and_the_publish_go_in_one_transaction(q: ReliableQueue) -> None:
    q.publish(b"warm")  # the scripts or the library are loaded
    assert q.claim(timeout=0)
    execs = calls(q.client, "exec")
    published = q.publish_result("id-1", before=("HSET", bodies(q), "id-1", b"body"))
    assert published.stored
    assert calls(q.client, "exec") - execs == 1
    assert q.client.hget(bodies(q), "id-1") == b"body"
    [d] = q.claim(timeout=0)
    assert (d.id, d.payload) == (published.id, b"id-1")


def test_a_lost_script_runs_again_alone_once_the_write_ran(q: ReliableQueue) -> None:
    q.publish(b"warm")
    assert q.claim(timeout=0)
    q.client.script_flush()
    if q._scripts._functions:
        q.client.execute_command("FUNCTION", "FLUSH")
    published = q.publish_result("id-2", before=("HSET", bodies(q), "id-2", b"body"),
                                 dedup_id="once")
    assert published.stored
    assert q.client.hget(bodies(q), "id-2") == b"body"
    assert q.stats()["ready"] == 1
    again = q.publish_result("id-2", before=("HSET", bodies(q), "id-2", b"body"),
                             dedup_id="once")
    assert not again.stored and again.id == published.id


@pytest.mark.parametrize("before", [
    "HSET k f v", (), [], ("HSET", "k", None), ("HSET", "k", "f", object()), 7,
], ids=["a str", "empty tuple", "empty list", "None in it", "an object in it", "an int"])
def test_a_bad_before_is_refused_and_nothing_is_written(q: ReliableQueue, before: Any) -> None:
    with pytest.raises(ConfigError, match="before must be a Redis command"):
        q.publish_result("id", before=before)
    assert q.stats()["ready"] == 0
    assert q.client.exists(bodies(q), "k") == 0


def test_a_command_refused_as_it_is_queued_applies_neither(
    q: ReliableQueue, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(redis.ResponseError, match=r"(?i)unknown command"):
        q.publish_result("id-3", before=("HSETX", bodies(q), "id-3", b"body"))
    assert q.stats()["ready"] == 0


def test_a_command_failing_as_it_runs_raises_and_the_message_is_published(
    q: ReliableQueue
) -> None:
    q.client.rpush(bodies(q), b"a list, not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        q.publish_result("id-4", before=("HSET", bodies(q), "id-4", b"body"))
    assert q.stats()["ready"] == 1  # as documented: the transaction ran on


@pytest.mark.parametrize("functions", [True, None], ids=["functions", "unset"])
def test_a_write_the_acl_refuses_applies_neither(
    r: redis.Redis, qname: str, functions: bool | None
) -> None:
    """The refusal is the write's own: the queue keeps calling belayq's function library
    (it does not take the write's refusal for one of FCALL's)."""
    user = f"nobody-{qname}"
    r.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+@all", "-append"])  # a command belayq's scripts do not use
    try:
        port = r.connection_pool.connection_kwargs["port"]
        with redis.Redis(port=port, username=user, password="pw") as limited:
            q = ReliableQueue(limited, qname, keeper=False, lua_functions=functions)
            q.publish(b"warm")
            assert q._scripts._functions is True  # Redis 7: the library
            with pytest.raises(NotPermitted, match=r"(?i)append"):
                q.publish_result("id-5", before=("APPEND", f"{qname}-bodies", b"b"))
            assert q.stats()["ready"] == 1  # the one before
            assert r.exists(f"{qname}-bodies") == 0
            assert q._scripts._functions is True
            q.drop()
    finally:
        r.acl_deluser(user)
