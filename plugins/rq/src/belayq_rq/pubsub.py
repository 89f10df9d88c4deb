"""Stopping a worker's pub/sub thread (RQ's command channel) without waiting for its poll.

RQ's teardown sends UNSUBSCRIBE, then asks the thread to stop, then joins it. The thread
polls with a 60 s timeout and looks at its stop flag only between polls. The UNSUBSCRIBE
reply wakes it; when it handles that reply before the main thread has set the flag (the
main thread gives up the GIL while it sends, and any other thread that wants the GIL then,
such as belayq's lease keeper, widens that window), the thread finds itself subscribed to
nothing and waits up to 60 s for a subscription that never comes. RQ's ``join(timeout=1)``
bounds that to a second, but from redis-py 8.2 on ``PubSubWorkerThread.stop()`` itself
joins the thread, with no timeout: the teardown then waits the whole 60 s.

Here the flag is set first, so the reply that wakes the thread also ends its loop, and the
wait for the thread is bounded by :data:`STOP_WAIT_S` on every redis-py version.
"""

from __future__ import annotations

import inspect
from typing import Any

import rq.worker

#: Longest a worker's teardown waits for its pub/sub thread to end (s), as RQ's own join.
STOP_WAIT_S = 1.0


def stop_without_waiting(thread: Any) -> None:
    """Set a ``PubSubWorkerThread``'s stop flag, without redis-py 8.2+'s join in ``stop``."""
    try:
        takes_timeout = "timeout" in inspect.signature(thread.stop).parameters
    except (TypeError, ValueError):  # no signature to read: an older stop() only sets it
        takes_timeout = False
    if takes_timeout:
        thread.stop(timeout=0)
    else:
        thread.stop()


class StopsItsPubSub(rq.worker.BaseWorker):
    """A worker whose teardown waits at most :data:`STOP_WAIT_S` for its pub/sub thread
    (see the module doc)."""

    def unsubscribe(self) -> None:
        thread, pubsub = self.pubsub_thread, self.pubsub
        if thread is None or pubsub is None:
            return
        self.log.info("Worker %s: unsubscribing from channel %s", self.name,
                      self.pubsub_channel_name)
        stop_without_waiting(thread)  # first: the UNSUBSCRIBE reply then ends its loop
        pubsub.unsubscribe()
        thread.join(STOP_WAIT_S)
        if thread.is_alive():  # a thread that ended closed its pubsub itself
            pubsub.close()
