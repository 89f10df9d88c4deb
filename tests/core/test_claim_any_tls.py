"""claim_any and ShardedQueue over TLS: every queue blocked at once, no polling.

A redis-server with a TLS port (certificates from a throwaway CA, as in
``tests/security/test_tls.py``); its plain port is used only to watch it (blocked clients,
command counts). What a consumer's thread sends is counted client-side, one send per
command or pipeline, as ``tests/core/test_shards.py`` does.
"""

from __future__ import annotations

import contextlib
import selectors
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from belayq import Delivery, ReliableQueue, ShardedQueue
from belayq.blocking import BlockingClaim
from belayq.claim_any import claim_any
from belayq.embedded import RedisServer
from tests.support import wait_for


def tls_client_of(
    tls_server: tuple[RedisServer, int, Path], parser: str = "default"
) -> redis.Redis:
    """A TLS client; ``parser="python"``: redis-py's own reply parser rather than hiredis
    (they differ in what ``can_read`` takes off the socket)."""
    _, port, ca = tls_server
    if parser == "default":
        return redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca),
                           ssl_cert_reqs="required")  # fmt: skip
    from redis._parsers import _RESP2Parser

    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=redis.SSLConnection, parser_class=_RESP2Parser, host="127.0.0.1",
        port=port, ssl_ca_certs=str(ca), ssl_cert_reqs="required",
    ))  # fmt: skip


@pytest.fixture(params=["default", "python"])
def tls_client(
    request: pytest.FixtureRequest, tls_server: tuple[RedisServer, int, Path]
) -> Iterator[redis.Redis]:
    client = tls_client_of(tls_server, request.param)
    yield client
    client.close()


@pytest.fixture(params=["tls", "tls-python-parser", "tcp"])
def either_client(
    request: pytest.FixtureRequest, tls_server: tuple[RedisServer, int, Path]
) -> Iterator[redis.Redis]:
    """A client of the server over TLS, or over its plain port (the figures side by side)."""
    if request.param == "tcp":
        client = redis.Redis(port=tls_server[0].port)
    else:
        client = tls_client_of(tls_server, "python" if "python" in request.param else "default")
    yield client
    client.close()


@pytest.fixture
def watcher(tls_server: tuple[RedisServer, int, Path]) -> Iterator[redis.Redis]:
    """A plain-port client of the same server, to watch it."""
    client = redis.Redis(port=tls_server[0].port)
    yield client
    client.close()




def blocked(watcher: redis.Redis) -> int:
    return int(watcher.info("clients")["blocked_clients"])


#: What a client sends; commandstats also counts the commands scripts run, which these omit.
SENT = ("evalsha", "eval", "fcall", "blmove", "client|unblock", "client|id", "ping")


def server_calls(watcher: redis.Redis) -> int:
    """Commands clients sent the server (a script counts once)."""
    stats = watcher.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in SENT)


def idle_second(
    watcher: redis.Redis, sent: Counter[threading.Thread], t: threading.Thread
) -> tuple[int, int]:
    """(commands the consumer's thread sent, commands the server ran) in one idle second,
    once the consumer's thread has stopped sending."""
    settled = [sent[t]]

    def quiet() -> bool:
        time.sleep(0.2)  # its last sends are out (a polling consumer never gets here)
        settled.append(sent[t])
        return settled[-1] == settled[-2]

    with contextlib.suppress(AssertionError):  # a polling consumer never gets quiet: the
        wait_for(quiet, 3, "the consumer's sends to end")  # idle second says how much it sends
    before, calls = sent[t], server_calls(watcher)
    time.sleep(1.0)
    return sent[t] - before, server_calls(watcher) - calls


def test_an_idle_consumer_of_three_shards_over_tls_sends_nothing_and_wakes_for_any_shard(
    either_client: redis.Redis, watcher: redis.Redis, sent: Counter[threading.Thread]
) -> None:
    label = "TLS" if "SSL" in either_client.connection_pool.connection_class.__name__ else "TCP"
    q = ShardedQueue(either_client, f"tls-{uuid.uuid4().hex[:8]}", shards=3, keeper=False)
    wakes: list[list[float]] = []  # per round, ms from a publish to the claim's return
    t: threading.Thread | None = None
    try:
        for round_ in range(4):
            wakes.append([])
            for target in q.shards:
                out: list[list[Delivery]] = []
                t = threading.Thread(target=lambda out=out: out.append(q.claim(timeout=20)))
                t.start()
                wait_for(lambda: blocked(watcher) == 3, 10, "a BLMOVE on every shard")
                if round_ == 0:  # an idle second on each shard's turn
                    consumer_sends, server_runs = idle_second(watcher, sent, t)
                    print(f"\n{label}, 3 shards, an idle second: the consumer sent "
                          f"{consumer_sends} command(s); the server received {server_runs}")
                    assert consumer_sends == 0, f"{consumer_sends} commands sent while idle"
                    assert blocked(watcher) == 3
                t0 = time.perf_counter()
                msg_id = target.publish(b"wake")
                t.join(10)
                wakes[-1].append((time.perf_counter() - t0) * 1000)
                assert [(d.id, d.shard) for d in out[0]] == [(msg_id, target.name)]
                assert q.ack(out[0][0])
                wait_for(lambda: blocked(watcher) == 0, 5, "the other BLMOVEs released")
    finally:
        if t is not None and t.is_alive():  # failed mid-way: end its claim
            for shard in q.shards:
                shard.publish(b"stop")
            t.join(25)
        q.close(release=False)
    # The first round opens the pool's connections (a TLS handshake each: tens of ms here).
    warm = sorted(w for ws in wakes[1:] for w in ws)
    p50 = warm[len(warm) // 2]
    print(f"{label} wake after a publish to one of 3 shards (n={len(warm)}): p50 {p50:.1f} ms, "
          f"max {warm[-1]:.1f} ms; first round {[round(w, 1) for w in wakes[0]]}")  # fmt: skip
    assert p50 < 50, warm
    assert warm[-1] < 1000, warm


def test_claim_any_over_tls_blocks_on_every_queue_in_priority_order(
    tls_client: redis.Redis, watcher: redis.Redis
) -> None:
    names = [f"tls-{uuid.uuid4().hex[:8]}-{i}" for i in range(3)]
    qs = [ReliableQueue(tls_client, n, keeper=False) for n in names]
    out: list[list[Delivery]] = []
    t = threading.Thread(target=lambda: out.append(claim_any(qs, 20)))
    t.start()
    try:
        wait_for(lambda: blocked(watcher) == 3, 10, "a BLMOVE on every queue")
    finally:
        t0 = time.perf_counter()
        msg_id = qs[2].publish(b"lowest")  # the lowest priority: never the one polled first
        t.join(10)
    waited_ms = (time.perf_counter() - t0) * 1000
    assert [(d.id, d.queue) for d in out[0]] == [(msg_id, names[2])]
    assert waited_ms < 1000
    assert qs[2].ack(out[0][0])
    wait_for(lambda: blocked(watcher) == 0, 5, "the other BLMOVEs released")
    qs[1].publish(b"mid")
    qs[0].publish(b"high")
    assert [d.payload for d in claim_any(qs, 1, count=2)] == [b"high", b"mid"]
    assert claim_any(qs, 0.2) == []


def readable(claim: BlockingClaim, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(claim.sock, selectors.EVENT_READ)
        return bool(sel.select(timeout))


def test_a_tls_claim_says_whether_its_reply_can_be_read_without_waiting(
    tls_client: redis.Redis,
) -> None:
    """What a waiter asks around every select: no reply yet (and no blocking read), then
    the reply, however the parser holds it, until it is read."""
    q = ReliableQueue(tls_client, f"tls-{uuid.uuid4().hex[:8]}", keeper=False)
    claim = BlockingClaim(q)
    try:
        claim.send(10.0)
        assert not claim.buffered() and claim.waiting
        msg_id = q.publish(b"x")
        assert readable(claim, 5.0)
        assert claim.buffered() and claim.buffered()  # asking twice loses nothing
        entry = claim.read()
        assert entry is not None and not claim.buffered()
        [d], _ = claim.lease(entry)
        assert d.id == msg_id and q.ack(d)
    finally:
        claim.close()
