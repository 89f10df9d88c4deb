"""The core's one blocking claim (core/src/belayq/blocking.py), which claim_any and the
kombu transport both wait with: send, read, lease, cancel, close."""

from __future__ import annotations

import selectors
import time
from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ReliableQueue
from belayq.blocking import BlockingClaim
from tests.conftest import make_client


@pytest.fixture(params=["redis", "redis62"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    c = make_client(request, request.param)
    yield c
    c.close()


def readable(claim: BlockingClaim, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(claim.sock, selectors.EVENT_READ)
        return bool(sel.select(timeout))


def test_a_blocked_claim_receives_and_leases_a_publish(make_queue: Any, client: Any) -> None:
    q: ReliableQueue = make_queue(client)
    claim = BlockingClaim(q)
    claim.send(5.0)
    assert claim.waiting and not readable(claim, 0.05)
    msg_id = q.publish(b"hello")
    assert readable(claim, 2.0)
    entry = claim.read()
    assert entry is not None and not claim.waiting
    assert q.stats()["landing"] == 1  # between BLMOVE and its lease: in the landing zone
    [d], _ = claim.lease(entry)
    assert (d.id, d.payload) == (msg_id, b"hello")
    assert q.stats()["landing"] == 0 and q.ack(d)
    claim.close()


def test_cancel_unblocks_at_once_and_the_connection_is_reused(
    make_queue: Any, client: Any
) -> None:
    q: ReliableQueue = make_queue(client)
    first = BlockingClaim(q)
    first.send(30.0)
    first_id = first.client_id
    assert first_id is not None
    started = time.monotonic()
    assert first.cancel() is None
    assert time.monotonic() - started < 2.0  # CLIENT UNBLOCK, not the 30 s timeout
    first.close()
    again = BlockingClaim(q)  # the pool hands back the same connection, id remembered
    again.connect()
    assert again.client_id == first_id
    again.close()


def test_cancel_returns_an_entry_the_claim_had_taken(make_queue: Any, client: Any) -> None:
    q: ReliableQueue = make_queue(client)
    claim = BlockingClaim(q)
    claim.send(5.0)
    msg_id = q.publish(b"raced")
    assert readable(claim, 2.0)  # BLMOVE took it before the cancel
    entry = claim.cancel()
    assert entry is not None
    [d], _ = claim.lease(entry)
    assert d.id == msg_id and q.ack(d)
    claim.close()


def test_close_with_a_reply_outstanding_closes_the_connection(
    make_queue: Any, client: Any
) -> None:
    q: ReliableQueue = make_queue(client)
    claim = BlockingClaim(q)
    claim.send(30.0)
    conn = claim.conn
    claim.close()
    assert conn._sock is None  # never reused with a BLMOVE reply still due
    assert claim.conn is None and not claim.waiting


def test_a_cancel_the_server_refuses_closes_instead_and_loses_nothing(
    make_queue: Any, client: Any
) -> None:
    q: ReliableQueue = make_queue(client, lease_ms=200)
    claim = BlockingClaim(q)
    claim.send(30.0)

    def refused(_id: int) -> None:
        import redis

        raise redis.ResponseError("NOPERM this user has no permissions to run 'client|unblock'")

    msg_id = q.publish(b"taken while cancelling")
    assert readable(claim, 2.0)
    assert claim.cancel(unblock=refused) is None  # closed: its entry waits in the landing
    assert claim.conn is not None and claim.conn._sock is None
    claim.close()
    assert q.stats()["landing"] == 1
    q.sweep()  # a provisional lease of lease_ms ...
    time.sleep(0.3)
    q.sweep()  # ... then back to ready
    [d] = q.claim(timeout=1)
    assert d.id == msg_id and q.ack(d)


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, False), ({"bell": False}, True), ({"bell": False, "priority_steps": (0,)}, False)],
)
def test_look_now_is_the_bell_rule(
    make_queue: Any, client: Any, options: dict[str, Any], expected: bool
) -> None:
    claim = BlockingClaim(make_queue(client, **options))
    assert claim.look_now(None) is expected
    assert claim.look_now(b"an entry") is False


def test_a_wait_ends_when_a_delayed_message_falls_due(make_queue: Any, client: Any) -> None:
    # A BLMOVE cannot promote a delayed message: the claim that knows the next due time
    # from its last reply waits only until then, and says to look at once.
    q: ReliableQueue = make_queue(client)
    msg_id = q.publish(b"later", delay_ms=400)
    claim = BlockingClaim(q)
    got, due_ms = claim.try_claim(1)
    assert got == [] and 0 < due_ms <= 400
    started = time.monotonic()
    claim.send(10.0)
    assert readable(claim, 5.0)
    assert claim.read() is None
    waited = time.monotonic() - started
    assert 0.2 <= waited < 2.0  # ended at the due time, not after the 10 s timeout
    assert claim.look_now(None)
    [d], due_ms = claim.try_claim(1)
    assert d.id == msg_id and due_ms == -1 and claim.due_at is None
    assert not claim.look_now(None)  # nothing delayed: a timeout says nothing new
    assert q.ack(d)
    claim.close()


def test_a_claim_script_sent_instead_of_a_blmove_claims_when_its_reply_is_read(
    make_queue: Any, client: Any
) -> None:
    q: ReliableQueue = make_queue(client, lease_ms=30_000)
    ids = [q.publish(f"m{i}".encode()) for i in range(3)]
    claim = BlockingClaim(q)
    claim.send_claim(2)
    assert claim.waiting and claim.claiming == 2
    assert readable(claim, 2.0)
    got, due_ms = claim.read_claim()
    assert [d.id for d in got] == ids[:2] and due_ms == -1
    assert not claim.waiting and claim.claiming == 0
    assert q.stats()["in_flight"] == 2 and q.ack_many(got) == [True, True]
    claim.close()


def test_a_claim_script_sent_after_the_scripts_were_flushed_claims_all_the_same(
    make_queue: Any, client: Any
) -> None:
    q: ReliableQueue = make_queue(client, lease_ms=30_000)
    msg_id = q.publish(b"m")
    client.script_flush()
    if q._scripts._functions:
        client.execute_command("FUNCTION", "FLUSH")
    claim = BlockingClaim(q)
    claim.send_claim(1)
    [d], _ = claim.read_claim()
    assert d.id == msg_id and q.ack(d)
    claim.close()


def test_cancelling_a_claim_script_hands_what_it_claimed_back_uncounted(
    make_queue: Any, client: Any
) -> None:
    q: ReliableQueue = make_queue(client, lease_ms=30_000)
    msg_id = q.publish(b"m")
    claim = BlockingClaim(q)
    claim.send_claim(1)
    assert claim.cancel() is None
    assert not claim.waiting and claim.claiming == 0
    s = q.stats()
    assert (s["ready"], s["in_flight"]) == (1, 0), s
    [d] = q.claim(timeout=1)
    assert (d.id, d.deliveries) == (msg_id, 1) and q.ack(d)
    claim.close()


def test_a_claimer_killed_before_reading_its_claim_scripts_reply_loses_nothing(
    make_queue: Any, client: Any
) -> None:
    """The claim ran, its reply was never read: the claims come back after their lease."""
    import subprocess
    import sys

    q: ReliableQueue = make_queue(client, lease_ms=1_000)
    msg_id = q.publish(b"m")
    port = client.connection_pool.connection_kwargs["port"]
    code = (
        "import os, signal, redis\n"
        "from belayq import ReliableQueue\n"
        "from belayq.blocking import BlockingClaim\n"
        f"q = ReliableQueue(redis.Redis(port={port}), {q.name!r}, keeper=False, lease_ms=1000)\n"
        "BlockingClaim(q).send_claim(1)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert q.stats()["in_flight"] == 1  # claimed, by nobody alive
    time.sleep(1.2)
    q.sweep()
    [d] = q.claim(timeout=2)
    assert d.id == msg_id and d.deliveries == 2 and q.ack(d)
