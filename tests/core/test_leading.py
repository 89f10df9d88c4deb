"""The lead of a queue (lua/lead.lua): one consumer process at a time answers for the
queue's delayed messages in its framework's views of them; it renews its lead, another
process cannot take it until it expires; reading who leads and the delayed set writes
nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from belayq import ReliableQueue, leading
from belayq.errors import ConfigError


def dumps(q: ReliableQueue) -> dict[str, Any]:
    return {k: q.client.dump(k) for k in q.keys.all_keys()}


def as_process(monkeypatch: pytest.MonkeyPatch, member: str) -> None:
    monkeypatch.setattr(leading, "consumer_member", lambda: member)


def something_delayed(q: ReliableQueue) -> None:
    """A message waits in the delayed set: the queue has something to lead."""
    q.publish(b"later", delay_ms=600_000)


def test_one_process_leads_a_queue_until_its_lead_lapses(
    q: ReliableQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    something_delayed(q)
    as_process(monkeypatch, "aaaa0001 host-a 11")
    assert q.leader() is None and not q.leads()
    assert q.lead(ttl_ms=400) is True
    assert q.leader() == "aaaa0001 host-a 11" and q.leads()
    as_process(monkeypatch, "bbbb0002 host-b 22")
    before = dumps(q)
    assert q.lead(ttl_ms=60_000) is False  # held by another process: left alone
    assert dumps(q) == before and q.client.pttl(q.keys.lead) <= 400
    assert not q.leads()
    as_process(monkeypatch, "aaaa0001 host-a 11")
    time.sleep(0.25)
    assert q.lead(ttl_ms=400) is True  # renewed by its holder
    time.sleep(0.25)
    as_process(monkeypatch, "bbbb0002 host-b 22")
    assert q.lead(ttl_ms=400) is False  # still held: the renewal counted
    time.sleep(0.3)
    assert q.lead(ttl_ms=400) is True  # lapsed: taken over
    assert q.leader() == "bbbb0002 host-b 22"


def test_the_lead_lasts_a_lease_by_default(q: ReliableQueue) -> None:
    something_delayed(q)
    assert q.lead() is True and q.leads()
    assert 0 < q.client.pttl(q.keys.lead) <= q.config.lease_ms


@pytest.mark.parametrize("ttl", [0, -1, 1.5, "10", True])
def test_a_bad_lead_ttl_is_refused_and_changes_nothing(q: ReliableQueue, ttl: Any) -> None:
    before = dumps(q)
    with pytest.raises(ConfigError, match="ttl_ms"):
        q.lead(ttl_ms=ttl)
    assert dumps(q) == before


def test_the_delayed_messages_are_read_soonest_first_and_bounded(q: ReliableQueue) -> None:
    q.publish(b"late", delay_ms=90_000)
    q.publish(b"soon", delay_ms=30_000)
    q.publish(b"middle", delay_ms=60_000)
    q.publish(b"now")
    before = dumps(q)
    got = q.delayed_messages(limit=2)
    assert [m.payload for m in got] == [b"soon", b"middle"]
    assert got[0].due_ms < got[1].due_ms
    assert [m.payload for m in q.delayed_messages(limit=10)] == [b"soon", b"middle", b"late"]
    assert dumps(q) == before  # a read writes nothing
    with pytest.raises(ConfigError, match="limit"):
        q.delayed_messages(limit=0)


def test_a_process_that_resigns_gives_up_only_its_own_lead(
    q: ReliableQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    something_delayed(q)
    as_process(monkeypatch, "aaaa0001 host-a 11")
    assert q.lead(ttl_ms=60_000) is True
    as_process(monkeypatch, "bbbb0002 host-b 22")
    before = dumps(q)
    assert q.resign() is False  # not its lead: left alone
    assert dumps(q) == before and q.leader() == "aaaa0001 host-a 11"
    as_process(monkeypatch, "aaaa0001 host-a 11")
    assert q.resign() is True and q.leader() is None
    as_process(monkeypatch, "bbbb0002 host-b 22")
    assert q.lead(ttl_ms=60_000) is True  # taken at once, not after the lead's 60 s


@pytest.mark.parametrize("functions", [None, False], ids=["functions", "scripts"])
def test_a_lead_with_nothing_delayed_creates_no_key_and_writes_nothing(
    client: Any, make_queue: Any, functions: bool | None
) -> None:
    q = make_queue(client, lease_ms=300, lua_functions=functions)
    q.publish(b"now")
    q.ack(q.claim(1)[0])  # the queue has been used, and nothing waits in it
    keys = sorted(client.keys("*"))
    writes = client.info("persistence")["rdb_changes_since_last_save"]
    for _ in range(12):  # renewed every third of a lease, for four leases
        assert q.lead() is False
        time.sleep(0.1)
    assert q.leader() is None and not client.exists(q.keys.lead)
    assert sorted(client.keys("*")) == keys
    assert client.info("persistence")["rdb_changes_since_last_save"] == writes


def test_a_lead_lapses_once_nothing_is_delayed(q: ReliableQueue) -> None:
    q.publish(b"soon", delay_ms=100)
    assert q.lead(ttl_ms=2_000) is True and q.leads()
    time.sleep(0.25)
    q.sweep()  # the message fell due: the delayed set is empty
    assert q.client.zcard(q.keys.delayed) == 0
    before = dumps(q)
    assert q.lead(ttl_ms=2_000) is False  # not renewed: nothing written
    assert dumps(q) == before and q.client.pttl(q.keys.lead) <= 1_750
    q.client.pexpire(q.keys.lead, 1)  # as its expiry would, sooner
    time.sleep(0.01)
    assert q.leader() is None and not q.client.exists(q.keys.lead)
