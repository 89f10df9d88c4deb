"""One queue's blocking claim on a connection of its own, for callers that wait on sockets.

A consumer that waits on several queues at once (:func:`belayq.claim_any`) or inside an
event loop (the kombu transport) cannot call :meth:`ReliableQueue.claim`, which blocks its
thread. It sends the queue's ``BLMOVE`` (:meth:`ReliableQueue.blmove_command`) on a
connection of its own, waits for the socket to become readable, reads the reply and hands
an entry to :meth:`ReliableQueue.lease_claimed`. :class:`BlockingClaim` owns that
connection and every step of it: connect (learning the connection's ``CLIENT ID``), send,
read, cancel (``CLIENT UNBLOCK`` from another connection, or close) and return the
connection to its pool.

Between the BLMOVE and its lease an entry sits in the queue's landing zone, where the sweep
gives it a provisional lease and returns it if the claimer dies: no step loses a message.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING, Any

import redis

from . import client_info
from .constants import CANCEL_GRACE_S
from .errors import RESPONSE_ERROR, left_primary
from .sent import pool_connection

if TYPE_CHECKING:
    from .models import Delivery
    from .queue import ReliableQueue


# A pooled connection remembers its socket's CLIENT ID here: (socket, id or None).
_CLIENT_ID = "_belayq_client_id"


def node_client(queue: ReliableQueue) -> Any:
    """The client of the server that holds ``queue``'s keys: the queue's own client, or on
    a cluster the client of the node that serves its slot."""
    client = queue.client
    if client_info.is_cluster(client):
        node = client.get_node_from_key(queue.keys.ready)
        return client.get_redis_connection(node)
    return client


class BlockingClaim:
    """``queue``'s BLMOVE on a connection taken from ``pool`` (default: the pool of the
    client that holds the queue's keys)."""

    def __init__(self, queue: ReliableQueue, pool: Any = None) -> None:
        self.queue = queue
        self.client: Any = node_client(queue)
        self.pool: Any = pool if pool is not None else self.client.connection_pool
        # With the node's own pool, each new connection goes to the node that serves the
        # slot then (a failover or a resharding moves it).
        self._follow_slot = pool is None
        self._redirected = False
        self.conn: Any = None
        self.client_id: int | None = None
        #: When the outstanding BLMOVE was sent (monotonic s); None when none is.
        self.sent_at: float | None = None
        #: When the outstanding call is a claim script (:meth:`send_claim`), not a BLMOVE:
        #: how many it asked for, and what turns its reply into deliveries.
        self._claim: tuple[int, Callable[[Any], tuple[list[Delivery], int]]] | None = None
        #: When the next delayed message falls due, as the last claim reply said (monotonic
        #: s); None when none is delayed. A BLMOVE cannot promote it, so the wait ends then.
        self.due_at: float | None = None

    @property
    def waiting(self) -> bool:
        """Whether a BLMOVE was sent and its reply is still to be read."""
        return self.sent_at is not None

    def connect(self) -> socket.socket:
        """The connection's socket, connecting first if needed. The connection's
        ``CLIENT ID`` (None when the server refuses it) is learned once per socket."""
        if self._redirected and self._follow_slot:
            self.close()
        self._redirected = False
        if self.conn is None:
            if self._follow_slot:
                self.client = node_client(self.queue)
                self.pool = self.client.connection_pool
            self.conn = pool_connection(self.pool)
        if self.conn._sock is None:
            self.sent_at = None
            self._claim = None
            self.conn.connect()
        known = getattr(self.conn, _CLIENT_ID, None)
        if known is None or known[0] is not self.conn._sock:
            self.conn.send_command("CLIENT", "ID")
            try:
                client_id: int | None = int(self.conn.read_response())
            except RESPONSE_ERROR:  # no permission: cancelling closes it instead
                client_id = None
            known = (self.conn._sock, client_id)
            setattr(self.conn, _CLIENT_ID, known)
        self.client_id = known[1]
        return self.sock

    @property
    def sock(self) -> socket.socket:
        sock: socket.socket = self.conn._sock
        return sock

    def send(self, timeout: float) -> None:
        """Send the queue's BLMOVE, waiting up to ``timeout`` s, or until the next delayed
        message falls due (connects if needed)."""
        self.connect()
        now = monotonic()
        if self.due_at is not None:
            timeout = min(timeout, max(self.due_at - now, 0.0))
        self.conn.send_command(*self.queue.blmove_command(timeout))
        self.sent_at = now

    @property
    def claiming(self) -> int:
        """How many the outstanding claim script asked for (0: none is outstanding)."""
        return 0 if self._claim is None else self._claim[0]

    @property
    def can_send_claim(self) -> bool:
        """Whether :meth:`send_claim` may be used: not on a cluster, whose slots may move
        between the send and the reply."""
        return not client_info.is_cluster(self.queue.client)

    def send_claim(self, count: int) -> None:
        """Send the queue's non-blocking claim of up to ``count`` (one script, as
        :meth:`try_claim`) instead of a BLMOVE, for when work is known to be waiting; read
        its reply with :meth:`read_claim` once the socket is readable."""
        self.connect()
        command, claimed = self.queue.claim_command(count)
        self.conn.send_command(*command)
        self._claim = (count, claimed)
        self.sent_at = monotonic()

    def read_claim(self) -> tuple[list[Delivery], int]:
        """The reply of :meth:`send_claim`: the deliveries and the ms until the next
        delayed message is due. A connection error, and the answer of a server a failover
        demoted, close the connection (as :meth:`read`)."""
        assert self._claim is not None, "no claim script is outstanding"
        _, claimed = self._claim
        self._claim = None
        try:
            reply: Any = self.conn.read_response()
        except RESPONSE_ERROR as exc:
            if left_primary(exc):
                self.conn.disconnect()
                raise redis.ConnectionError(f"the server left the primary role: {exc}") from exc
            reply = exc
        except Exception:
            self.conn.disconnect()
            raise
        finally:
            self.sent_at = None
        got, due_ms = claimed(reply)
        self.note_due(due_ms)
        return got, due_ms

    def lost(self) -> None:
        """The connection was closed under the outstanding call: no reply will come."""
        self.sent_at = None
        self._claim = None

    def note_due(self, due_ms: int) -> None:
        """Remember when the next delayed message falls due (``due_ms`` from a claim reply:
        ms from now, -1 = none is delayed)."""
        self.due_at = None if due_ms < 0 else monotonic() + due_ms / 1000

    def try_claim(self, count: int = 1) -> tuple[list[Delivery], int]:
        """The queue's non-blocking claim (see ``try_claim``), noting the next due time."""
        got, due_ms = self.queue.try_claim(count)
        self.note_due(due_ms)
        return got, due_ms

    def buffered(self) -> bool:
        """Whether the reply can be read now, without waiting: redis-py's parser has its
        bytes, or the TLS layer holds them decrypted (a select on the socket no longer
        reports either), or the socket is readable. With redis-py's own parser this reads
        what the socket holds, so a TLS record that carries no reply says False. A
        connection error closes the connection (as :meth:`read`)."""
        try:
            return bool(self.conn.can_read(timeout=0))
        except Exception:
            self.conn.disconnect()
            self.sent_at = None
            raise

    @property
    def redirected(self) -> bool:
        """The last reply was a redirection (MOVED/ASK; on a cluster also UNBLOCKED): the
        queue's slot is served elsewhere now."""
        return self._redirected

    def read(self) -> bytes | None:
        """The BLMOVE's reply: an entry now in the queue's landing zone (pass it to
        :meth:`lease`), or None (timed out, or redirected by a cluster mid-resharding: the
        next non-blocking claim re-routes). A connection error closes the connection, and
        so does the answer of a server a failover demoted (raised as
        ``redis.ConnectionError``)."""
        try:
            reply = self.conn.read_response()
        except RESPONSE_ERROR as exc:
            if left_primary(exc) and not client_info.is_cluster(self.queue.client):
                # A failover demoted the server (Sentinel, a moved address): connect again.
                self.conn.disconnect()
                raise redis.ConnectionError(f"the server left the primary role: {exc}") from exc
            # MOVED/ASK; on a cluster also UNBLOCKED (its master became a replica).
            reply = None
            self._redirected = True  # the next send connects to the slot's owner then
        except Exception:
            self.conn.disconnect()
            raise
        finally:
            self.sent_at = None
        return None if reply is None else bytes(reply)

    def lease(self, entry: bytes, count: int = 1) -> tuple[list[Delivery], int]:
        """Lease ``entry`` and claim up to ``count - 1`` more (see ``lease_claimed``),
        noting the next due time."""
        got, due_ms = self.queue.lease_claimed(entry, count)
        self.note_due(due_ms)
        return got, due_ms

    def look_now(self, entry: bytes | None) -> bool:
        """Whether a claim without blocking should follow this reply (a timeout): when a
        delayed message has fallen due (the claim promotes it), and when the bell is off
        (``bell=False``): a BLMOVE watches the first priority level only, and then nothing
        wakes it when lower levels get work, so a timeout says nothing about them."""
        if entry is not None:
            return False
        if self.due_at is not None and monotonic() >= self.due_at:
            return True
        return not self.queue.config.bell and len(self.queue.keys.levels) > 1

    def cancel(
        self, unblock: Callable[[int], Any] | None = None, grace_s: float = CANCEL_GRACE_S
    ) -> bytes | None:
        """Stop an outstanding BLMOVE; returns the entry it had already taken, if any.

        ``unblock`` sends ``CLIENT UNBLOCK <id>`` on another connection (default: the
        queue's client), so the server answers at once; when it cannot (no client id, no
        permission) or no answer comes within ``grace_s``, the connection is closed, and
        whatever it took waits in the landing zone for the sweep.
        """
        if not self.waiting or self.conn is None or self.conn._sock is None:
            self.sent_at = None
            self._claim = None
            return None
        if self._claim is not None:
            self._cancel_claim(grace_s)
            return None
        if self.client_id is not None:
            try:
                (unblock or self._unblock)(self.client_id)
            except RESPONSE_ERROR:  # no permission for CLIENT UNBLOCK
                self.client_id = None
        if self.client_id is not None and self.conn.can_read(timeout=grace_s):
            return self.read()
        self.conn.disconnect()
        self.sent_at = None
        return None

    def _cancel_claim(self, grace_s: float) -> None:
        """Wait for an outstanding claim script's reply and hand what it claimed back to
        the front of the queue (uncounted); without a reply in time the connection is
        closed and the claims return after their lease."""
        if self.conn.can_read(timeout=grace_s):
            got, _ = self.read_claim()
            if got:
                self.queue.release(got)
            return
        self.conn.disconnect()
        self.sent_at = None
        self._claim = None

    def _unblock(self, client_id: int) -> None:
        self.client.execute_command("CLIENT", "UNBLOCK", client_id)

    def close(self) -> None:
        """Give the connection back to its pool, closing it first if a reply is still
        outstanding (a cancel that got no answer)."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self.sent_at is not None:
            conn.disconnect()
            self.sent_at = None
            self._claim = None
        try:
            self.pool.release(conn)
        except Exception:  # a pool that was reset meanwhile
            conn.disconnect()
