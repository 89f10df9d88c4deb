"""Prefetch accounting as in kombu; settlement through the core (see :mod:`.tags`).

On close, unstarted messages are released to the front of their queues; the claims of
tasks Celery is still running (the channel closed under them: a connection blip) are
kept and extended until the tasks settle them.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as _stock
from kombu.transport import virtual as _virtual
from kombu.utils.objects import cached_property

from . import celery_state

log = logging.getLogger("belayq.kombu")

# kombu's annotations are partial; to mypy --strict these modules are Any.
stock: Any = _stock
virtual: Any = _virtual


class QoS(stock.QoS):  # type: ignore[misc]
    """Prefetch accounting as in kombu; settlement through the core."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: Any) -> None:
        # A message whose body did not decode is malformed: a consumer that acks it to be
        # rid of it (Celery's on_decode_error) quarantines it, with the decode error.
        undecodable = getattr(self._delivered.get(delivery_tag), "undecodable", None)
        if undecodable:
            self.channel.claims.reject(
                delivery_tag, requeue=False, dead_letter=True, reason=undecodable
            )
        else:
            self.channel.claims.ack(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        self.channel.claims.reject(
            delivery_tag, requeue=requeue, dead_letter=self.channel.dead_letter_rejected,
            reason=None if requeue else _rejected_reason(self._delivered.get(delivery_tag)),
        )
        virtual.QoS.ack(self, delivery_tag)

    def restore_unacked(self, client: Any = None) -> list[Any]:
        """basic_recover: hand every unacked message back (uncounted)."""
        self.channel.claims.flush()
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        self.channel.claims.release(tags)
        return []

    def restore_unacked_once(self, stderr: Any = None) -> None:
        """On close: release unstarted messages, keep the leases of running tasks."""
        self._on_collect.cancel()
        self.channel.claims.flush()
        self._flush()
        state = self._delivered
        if getattr(state, "restored", None):
            return
        try:
            if not state:
                return
            in_pool = celery_state.in_pool_requests()
            keep = [t for t in state if t in in_pool]
            back = [t for t in state if t not in in_pool]
            written = celery_state.keep_written_jobs(in_pool[t] for t in keep)
            if not (self.restore_at_shutdown and self.channel.do_restore):
                for tag in back:
                    self.channel.claims.abandon(tag)
                back = []
            if back:
                log.info("belayq: releasing %d unstarted message(s)", len(back))
                self.channel.claims.release(back)
            if keep:
                log.info("belayq: keeping the leases of %d running task(s)%s", len(keep),
                         f" ({written} written to a pool child, not yet started)" if written
                         else "")
                jobs = {tag: celery_state.pool_job(in_pool[tag]) for tag in keep}
                self.channel.claims.kept.keep(jobs, float(self.channel.blip_keep_max))
            for tag in back:
                state.pop(tag, None)
        finally:
            state.restored = True

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        """The stock visibility-timeout hook: the core's sweep plus stock adoption."""
        self.channel.sweep()
        self.channel.adopt_stock()

    @cached_property
    def visibility_timeout(self) -> float:
        # Read by the stock restore_visible that adopts the stock unacked hash.
        return float(self.channel.stock_unacked_timeout)


def _rejected_reason(message: Any) -> str:
    """The dead-letter reason of a message rejected without requeue, naming its task
    (Celery rejects unregistered and invalid tasks this way)."""
    headers = getattr(message, "headers", None)
    task = headers.get("task") if isinstance(headers, dict) else None
    if task is None:
        return "rejected without requeue"
    return f"rejected without requeue (task {str(task)[:200]!r})"
