"""The consume policy: when a channel claims, how much, and what it does with a reply.

kombu's poller contract (:mod:`.poller`: ``on_poll_start``, ``on_readable``,
``handle_event``, ``get``) is plumbing; every decision it needs is asked here:

* **credit**: how many messages the next claim may take (kombu's prefetch, shared by the
  channel's queues, capped by ``claim_batch``);
* **wants more**: in a Celery worker whose pool still has prefetched tasks waiting, claim
  only once half the credit is free, so one claim takes several messages;
* **the next step** of a consumed queue at the start of a poll: deliver what the last ack's
  round trip claimed, claim what is known to be waiting (one script), or send a blocking
  claim;
* **a reply**: lease what the blocking claim took, plus more up to the credit, and deliver
  it; a reply that arrives after the credit ran out is leased and handed straight back
  (uncounted), never dropped.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from belayq.blocking import BlockingClaim

from . import celery_state, options
from .tags import give_back

if TYPE_CHECKING:
    from belayq import Delivery, ReliableQueue

    from .channel import Channel

log = logging.getLogger("belayq.kombu")


class Step(enum.Enum):
    """What the poller does for one consumed queue at the start of a poll."""

    IDLE = "idle"  # a blocking claim is already pending, or no credit: nothing
    DELIVERED = "delivered"  # messages were handed to kombu here
    BLOCK = "block"  # send a blocking claim and watch its socket


class Waiter:
    """One consumed queue of one channel: its blocking claim (the core's
    :class:`~belayq.blocking.BlockingClaim`, on a connection of the channel's pool) and what
    the consume policy knows about it."""

    def __init__(self, channel: Channel, queue: str, rq: ReliableQueue) -> None:
        self.channel = channel
        self.queue = queue
        self.rq = rq
        self.claim = BlockingClaim(rq, pool=channel.claim_pool(rq))
        #: The last claim took all it could: more is probably waiting, so claim without
        #: blocking (one script instead of a blocking claim plus a lease script).
        self.hot = False
        #: Claimed in the round trip that sent the last acks (drain_events only), delivered
        #: by the next poll: at prefetch 1 a message costs one round trip, not two.
        self.ready: list[Delivery] = []
        #: The last blocking claim was answered with an error (on a cluster: MOVED, or
        #: UNBLOCKED by a failover that demoted its node), not a timeout.
        self.redirected = False

    @property
    def conn(self) -> Any:
        return self.claim.conn

    @property
    def sent_at(self) -> float | None:
        return self.claim.sent_at

    def socket(self) -> Any:
        """The connected socket, connecting (and learning the client id) if needed."""
        return self.claim.connect()

    def send(self, timeout: float, credit: int = 1) -> None:
        """Send the blocking claim; when work is known to be waiting (``hot``), the claim
        script of up to ``credit`` instead: one round trip, answered at once."""
        if self.hot and self.claim.can_send_claim:
            self.claim.send_claim(max(1, credit))
        else:
            self.claim.send(timeout)

    def read(self) -> bytes | None:
        """The blocking claim's reply (an entry, or None on timeout or a redirection:
        MOVED, ASK, UNBLOCKED on a cluster, see follow_slot). A demoted server's answer
        off a cluster is raised as a connection error: the channel reconnects."""
        if self.claim.claiming:  # a claim script (not the blocking claim) read off the usual path
            got, _ = self.claim.read_claim()
            give_back(self.rq, got)
            return None
        reply = self.claim.read()
        if self.claim.redirected:
            self.redirected = True
        return reply

    def follow_slot(self) -> None:
        """After a redirect on a cluster (a failover or a resharding moved the queue's
        slot), wait on the node that serves the slot now. The caller first runs a claim
        through the cluster client, which learns the new owner from the MOVED it gets."""
        self.redirected = False
        pool = self.channel.claim_pool(self.rq)
        if pool is self.claim.pool:
            return
        old, self.claim = self.claim, BlockingClaim(self.rq, pool=pool)
        if old.conn is not None:
            old.conn.disconnect()  # the poller forgets its socket
        old.close()

    def lost(self) -> None:
        """Its connection was closed under it: no reply will come."""
        self.claim.lost()

    def close(self, unblock: Callable[[int], Any] | None) -> bytes | None:
        """Stop waiting; returns an entry the pending claim had already taken, if any.

        ``unblock`` (CLIENT UNBLOCK on another connection) makes a waiting claim return
        at once instead of after its timeout.
        """
        try:
            grace_s = self.channel.brpop_timeout + options.CANCEL_GRACE_S
            return self.claim.cancel(unblock, grace_s=grace_s)
        except Exception:
            log.debug("closing the claim connection of %s", self.queue, exc_info=True)
            return None
        finally:
            with contextlib.suppress(Exception):
                if self.claim.conn is not None:
                    self.claim.conn.disconnect()
            self.claim.close()


class Consume:
    """The consume policy of one channel (see the module doc)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def credit(self) -> int:
        """How many messages the next claim may take (prefetch credit, shared by queues)."""
        channel = self.channel
        qos = channel.qos
        if "can_consume" in vars(qos):  # Celery's worker_disable_prefetch patched it
            return 1 if qos.can_consume() else 0
        estimate = qos.can_consume_max_estimate()
        if estimate is None:
            return int(channel.claim_batch)
        share = -(-int(estimate) // max(1, len(channel.waiters(create=False))))
        return min(share, int(estimate), int(channel.claim_batch))

    def wants_more(self) -> bool:
        """Whether to claim now. In a Celery worker whose pool still has prefetched tasks
        waiting, claim only once half the prefetch credit is free: one claim then takes
        several messages instead of one per finished task, and no pool process idles
        meanwhile (it has waiting work)."""
        waiting = celery_state.prefetched_waiting()
        return waiting <= 0 or self.credit() >= max(1, int(self.channel.qos.prefetch_count) // 2)

    def step(self, waiter: Waiter, *, with_hub: bool) -> Step:
        """The start of a poll for one consumed queue.

        Without an event loop, what is known to be waiting is claimed and delivered right
        here. With one, deliveries must come from a readable socket: Celery schedules the
        acks for the next loop iteration, which only a socket event starts.
        """
        if waiter.sent_at is not None or not self.channel.qos.can_consume():
            return Step.IDLE
        if with_hub and not self.wants_more():
            return Step.IDLE
        if waiter.ready and self.deliver_ready(waiter):
            return Step.DELIVERED
        if waiter.hot and not with_hub and self.claim_now(waiter):
            return Step.DELIVERED
        return Step.BLOCK

    def on_reply(self, waiter: Waiter) -> bool:
        """Read a blocking claim's reply and deliver what the lease script claimed (or,
        for a claim script, what it claimed)."""
        asked = waiter.claim.claiming
        if asked:
            got, _ = waiter.claim.read_claim()
            waiter.hot = len(got) >= asked
            waiter.ready = got
            return self.deliver_ready(waiter)
        entry = waiter.read()
        if entry is None and waiter.redirected and self.channel.follows_slots:
            waiter.hot = False
            delivered = self.claim_now(waiter)  # through the cluster client: learns the owner
            waiter.follow_slot()
            return delivered
        if entry is None:
            waiter.hot = False
            if waiter.claim.look_now(entry):
                return self.claim_now(waiter)
            return False
        rq = waiter.rq
        credit = self.credit() if self._consumed(waiter) else 0
        if credit < 1:
            deliveries, _ = waiter.claim.lease(entry, 1)
            give_back(rq, deliveries)
            waiter.hot = True
            return False
        deliveries, _ = waiter.claim.lease(entry, credit)
        waiter.hot = len(deliveries) >= credit
        return self.channel.deliver(waiter.queue, rq, deliveries)

    def claim_now(self, waiter: Waiter) -> bool:
        """Claim what is waiting without blocking, up to the credit; True if delivered."""
        credit = self.credit()
        if credit < 1:
            return False
        deliveries, _ = waiter.claim.try_claim(credit)
        waiter.hot = len(deliveries) >= credit
        return bool(deliveries) and self.channel.deliver(waiter.queue, waiter.rq, deliveries)

    def deliver_ready(self, waiter: Waiter) -> bool:
        """Deliver what the last ack's round trip claimed, within the credit left."""
        ready, waiter.ready = waiter.ready, []
        credit = max(0, self.credit()) if self._consumed(waiter) else 0
        if len(ready) > credit:
            give_back(waiter.rq, ready[credit:])
            ready = ready[:credit]
        return bool(ready) and self.channel.deliver(waiter.queue, waiter.rq, ready)

    def with_acks(self, waiter: Waiter) -> int:
        """How many messages to claim in the round trip that sends the acks (drain_events
        only): the credit, for a queue whose last claim found more waiting; else 0."""
        if not (waiter.hot and waiter.sent_at is None and not waiter.ready):
            return 0
        return self.credit() if self.channel.qos.can_consume() else 0

    @staticmethod
    def took_with_acks(waiter: Waiter, deliveries: list[Delivery], asked: int) -> None:
        """Keep what the ack's round trip claimed for the next poll to deliver."""
        waiter.ready = deliveries
        waiter.hot = len(deliveries) >= asked

    def _consumed(self, waiter: Waiter) -> bool:
        return waiter.queue in self.channel._active_queues
