"""Helpers of the production-event tests (failover, restart, resharding).

Servers: every test starts its own redis-servers (:class:`belayq.embedded.RedisServer`) on
free ports, each in its own temporary directory; :func:`kill9` and :func:`restart` SIGKILL a
server and start it again on the same port and directory. Replication: :func:`start_pair`,
:func:`cut`, :func:`promote`. :class:`Forwarder` stands for the virtual IP (or proxy) in
front of the primary that a failover moves to the promoted replica.

Queue history: :func:`run_history` drives a queue through a fixed sequence of claims and
settles around a checkpoint (the last write a replica or a snapshot still has) and records
every token handed out; :func:`reclaim_all` and the ``check_*`` functions are the checks
the tests make on the surviving data. Only the public API of ``ReliableQueue`` is used.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from belayq import Delivery, ReliableQueue
from belayq.embedded import RedisServer, free_port
from tests import support

# Lease of the claims made before an event: short, so the surviving node reclaims them soon.
LEASE_MS = 1500
# Lease of the claims made after it: longer than any check, so nothing expires mid-check.
LONG_LEASE_MS = 120_000
# Generous bound of every poll on a loaded 2-vCPU machine.
POLL_S = 20.0


# -- polling -------------------------------------------------------------------------------


def wait_for(predicate: Callable[[], Any], what: Any, timeout: float = POLL_S) -> Any:
    """:func:`tests.support.wait_for` with this module's generous default timeout."""
    return support.wait_for(predicate, timeout, what, step=0.02)


# -- servers -------------------------------------------------------------------------------


def kill9(server: RedisServer) -> None:
    """SIGKILL the server (no shutdown save, no AOF flush); its directory stays."""
    proc = server.proc
    assert proc is not None, "server not running"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    server.proc = None


def restart(server: RedisServer) -> None:
    """Start a killed server again on the same port and directory (it loads its RDB/AOF);
    returns once it answers PING (not while it is still loading)."""
    server.start()


def cached_scripts(client: redis.Redis) -> int:
    """How many scripts the server has in its script cache."""
    return int(client.info("memory").get("number_of_cached_scripts", 0))


def empty_script_cache(client: redis.Redis) -> None:
    """Make sure the script cache is empty, as after a restart or a promotion on Redis 7
    (Redis < 7 replicated and persisted SCRIPT LOAD; there we flush to get the same state)."""
    if cached_scripts(client):
        client.script_flush()


def supports_functions(client: redis.Redis) -> bool:
    """Whether the server has Redis FUNCTIONs (7.0+)."""
    return int(str(client.info("server")["redis_version"]).split(".")[0]) >= 7


def flush_lua(client: redis.Redis) -> None:
    """Empty the server's script cache and, on Redis 7+, delete its function libraries:
    every way belayq's transitions can vanish from a live server."""
    client.script_flush()
    if supports_functions(client):
        client.function_flush()


def aof_flushed(client: redis.Redis) -> None:
    """Wait until the AOF buffer is written to the file (what a SIGKILL keeps: the page
    cache survives a process kill; appendfsync everysec may postpone writes, not lose them)."""

    def done() -> bool:
        info = client.info("persistence")
        return int(info.get("aof_buffer_length", 0)) == 0 and not int(
            info.get("aof_rewrite_in_progress", 0)
        )

    wait_for(done, "the AOF buffer to reach the file")


def replication(client: redis.Redis) -> dict[str, Any]:
    return dict(client.info("replication"))


def start_pair(
    start_server: Callable[..., RedisServer],
) -> tuple[RedisServer, RedisServer]:
    """A primary and a replica of it, with the link up and the first sync done."""
    # No 5 s wait for more replicas before the first (diskless) full sync.
    primary = start_server("--repl-diskless-sync-delay", "0")
    replica = start_server("--replicaof", "127.0.0.1", str(primary.port))
    rc = redis.Redis(port=replica.port)
    try:
        wait_for(
            lambda: (
                (info := replication(rc)).get("master_link_status") == "up"
                and not int(info.get("master_sync_in_progress", 0))
            ),
            "the replica's link to be up",
        )
    finally:
        rc.close()
    return primary, replica


def replicated(primary: redis.Redis, replicas: int = 1, timeout_ms: int = 10_000) -> None:
    """WAIT until ``replicas`` replicas have every write so far; fail if they do not."""
    got = int(primary.execute_command("WAIT", replicas, timeout_ms))
    assert got >= replicas, f"only {got} replica(s) confirmed the writes"


def cut(replica: redis.Redis) -> None:
    """Stop replication: the replica follows a port nothing listens on, keeps its data and
    applies nothing the primary writes from now on."""
    replica.execute_command("REPLICAOF", "127.0.0.1", free_port())
    wait_for(
        lambda: replication(replica).get("master_link_status") != "up",
        "the replica to drop its link",
    )


def promote(replica: redis.Redis) -> None:
    """Fail over: the replica becomes a primary with the data it has."""
    replica.execute_command("REPLICAOF", "NO", "ONE")
    wait_for(lambda: replication(replica).get("role") == "master", "the promotion")


class Forwarder:
    """A TCP forwarder on 127.0.0.1 standing for the virtual IP (or proxy) in front of the
    primary: clients connect to :attr:`port`; :meth:`point_to` moves it to another server and
    drops every open connection, as a failover does."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="forwarder").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                up.settimeout(None)
            except OSError:
                down.close()
                continue
            with self._lock:
                self._open.update((down, up))
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
            with self._lock:
                self._open.discard(s)

    def point_to(self, port: int) -> None:
        self.target_port = port
        with self._lock:
            socks = list(self._open)
        self._drop(*socks)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.point_to(self.target_port)


# -- queues --------------------------------------------------------------------------------


def make_queue(client: Any, name: str, **options: Any) -> ReliableQueue:
    """A queue without the lease keeper (the tests decide when leases are extended)."""
    options.setdefault("keeper", False)
    return ReliableQueue(client, name, **options)


def sizes(q: ReliableQueue) -> dict[str, int]:
    s = q.stats()
    return {k: int(s.get(k, 0)) for k in ("ready", "in_flight", "delayed", "dead")}


@dataclass
class History:
    """What a queue handed out before an event.

    Attributes:
        issued: Every claim handed out, in order (several per message for some).
        m_kept: The claim of message M that the surviving data still holds.
        m_lost: M's next claim, made after the checkpoint (M nacked and claimed again).
        present: Ids the surviving data must hold (ready, in flight, delayed or dead).
        dead: The ids among them that are dead letters.
        lost_writes: Whether the writes after the checkpoint are gone (replica, snapshot).
    """

    issued: list[Delivery] = field(default_factory=list)
    m_kept: Delivery | None = None
    m_lost: Delivery | None = None
    present: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    lost_writes: bool = True

    @property
    def tokens(self) -> set[str]:
        return {d.token for d in self.issued}


def run_history(q: ReliableQueue, checkpoint: Callable[[], None], *, lost_writes: bool) -> History:
    """Publish, claim and settle on ``q`` before and after ``checkpoint``.

    Before: 12 ready messages and one delayed (due 1 s later); a claim of 4: two acked,
    one dead-lettered, one released; then M (the released one) claimed and held: the only
    claim in flight at the checkpoint. After: M nacked and claimed again (its token moves
    on), 3 more claimed (acked, nacked with a delay, dead-lettered), 2 claimed and held,
    3 published. With ``lost_writes`` the surviving data is the state at the checkpoint.
    """
    h = History(lost_writes=lost_writes)
    ids = q.publish_many([f"a{i}" for i in range(10)])
    ids += [q.publish("a10"), q.publish("a11"), q.publish("a-delayed", delay_ms=1000)]
    batch = q.claim(timeout=5, count=4)
    assert len(batch) == 4, batch
    assert q.ack_many(batch[:2]) == [True, True]
    assert q.dead_letter(batch[2], "poison before the checkpoint")
    assert q.release([batch[3]]) == 1
    got = q.claim(timeout=5)
    assert [d.id for d in got] == [batch[3].id], "a released claim goes to the front"
    m = got[0]
    h.issued += [*batch, m]
    h.m_kept = m
    h.present = set(ids) - {d.id for d in batch[:2]}
    h.dead = {batch[2].id}

    checkpoint()

    assert q.nack(m, reason="retry after the checkpoint") == "ready"
    again = q.claim(timeout=5)
    assert [d.id for d in again] == [m.id], "a nack with delay_ms=0 goes to the front"
    h.m_lost = again[0]
    assert h.m_lost.token != m.token
    more = q.claim(timeout=5, count=3)
    assert len(more) == 3, more
    assert q.ack(more[0])
    assert q.nack(more[1], delay_ms=300, reason="later") == "delayed"
    assert q.dead_letter(more[2], "poison after the checkpoint")
    held = q.claim(timeout=5, count=2)
    assert len(held) == 2, held
    late = q.publish_many(["b0", "b1", "b2"])
    h.issued += [h.m_lost, *more, *held]
    if not lost_writes:
        h.present = (h.present | set(late)) - {more[0].id}
        h.dead = h.dead | {more[2].id}
    return h


def reclaim_m_first(q: ReliableQueue, h: History) -> Delivery:
    """Wait until M's lease (from before the event) expires and is swept back to the front
    of ready, then claim it: the first claim made after the event."""
    assert h.m_kept is not None
    wait_for(lambda: q.sweep().reclaimed >= 1, "M's pre-event lease to expire and be swept")
    got = q.claim(timeout=5)
    if h.lost_writes:
        assert [d.id for d in got] == [h.m_kept.id], "the swept claim goes to the front"
    return got[0]


def reclaim_all(q: ReliableQueue, h: History, first: list[Delivery]) -> list[Delivery]:
    """Claim every message the surviving data holds (``first``: claims made already),
    sweeping expired pre-event leases and waiting for delayed messages; then look once
    more so that a duplicate would show."""
    want = len(h.present - h.dead)
    got = list(first)
    deadline = time.monotonic() + POLL_S
    while len(got) < want and time.monotonic() < deadline:
        q.sweep()
        got += q.claim(timeout=0.2, count=100)
    time.sleep(0.05)
    q.sweep()
    got += q.claim(timeout=0, count=100)
    return got


def recover_everything(q: ReliableQueue, h: History) -> list[Delivery]:
    """After the event: M's pre-event lease is swept and M claimed first, then every other
    message; checks that nothing was lost or claimed twice, and returns the claims."""
    got = reclaim_all(q, h, [reclaim_m_first(q, h)])
    check_nothing_lost(q, h, got)
    return got


def check_nothing_lost(q: ReliableQueue, h: History, got: list[Delivery]) -> None:
    """Every message of the surviving data is claimable or dead exactly once."""
    dup = sorted(i for i, n in Counter(d.id for d in got).items() if n > 1)
    assert not dup, f"claimed twice after the event: {dup}"
    claimed = {d.id for d in got}
    dead = [dl.id for dl in q.dead_letters(1000)]
    assert len(dead) == len(set(dead)), f"a dead letter listed twice: {dead}"
    assert not claimed & set(dead), f"both claimed and dead: {sorted(claimed & set(dead))}"
    assert set(dead) == h.dead, f"dead letters {sorted(dead)}, expected {sorted(h.dead)}"
    missing = h.present - h.dead - claimed
    extra = claimed - h.present
    assert not missing, f"lost in the event: {sorted(missing)}"
    assert not extra, f"claimed but not in the surviving data: {sorted(extra)}"
    assert sizes(q) == {"ready": 0, "in_flight": len(got), "delayed": 0, "dead": len(h.dead)}


def check_tokens_fresh(h: History, got: list[Delivery]) -> None:
    """No token handed out after the event equals one handed out before it."""
    repeated = sorted((d.token, d.id) for d in got if d.token in h.tokens)
    assert not repeated, (
        f"{len(repeated)} of {len(got)} tokens handed out after the event repeat tokens "
        f"handed out before it (token, id): {repeated}"
    )


def check_stale_refused(q: ReliableQueue, h: History, got: list[Delivery]) -> None:
    """Settles with pre-event tokens are refused, counted, and change nothing; the holders
    of the claims made after the event then ack them all."""
    assert h.m_kept is not None and h.m_lost is not None
    before = sizes(q)
    stale0 = int(q.stats().get("stale_acks", 0))
    # Only claims of messages the surviving data holds: an ack of a message that is gone
    # may report success (a re-sent ack whose first run settled it).
    stale_claims = [d for d in h.issued if d.id in h.present]
    accepted = [(d.id, d.token) for d in stale_claims if q.ack(d)]
    assert not accepted, f"acks with pre-event tokens were accepted (id, token): {accepted}"
    calls = len(stale_claims)
    for d in (h.m_kept, h.m_lost):
        outcome = q.nack(d, reason="stale holder")
        assert outcome == "stale", f"nack with a pre-event token of M: {outcome!r}"
        assert q.extend([d]) == [False], "extend with a pre-event token of M"
        assert q.release([d]) == 0, "release with a pre-event token of M"
        calls += 3
    stale = int(q.stats().get("stale_acks", 0)) - stale0
    assert stale == calls, f"stale_acks grew by {stale}, expected {calls}"
    assert sizes(q) == before, "refused settles changed the queue"
    assert q.ack_many(got) == [True] * len(got), "the post-event holders' acks"
    after = sizes(q)
    assert after == {"ready": 0, "in_flight": 0, "delayed": 0, "dead": len(h.dead)}, after
    assert h.m_kept.id not in {dl.id for dl in q.dead_letters(1000)}
    assert q.claim(timeout=0) == [], "a message came back after its ack"


@contextlib.contextmanager
def closing_all(things: list[Any]) -> Iterator[None]:
    """Close every object in ``things`` at the end (also those appended meanwhile)."""
    try:
        yield
    finally:
        for t in reversed(things):
            with contextlib.suppress(Exception):
                t.close()
