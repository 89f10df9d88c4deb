"""The core's fixed numbers, each with the reason for its value.

What a user may tune is a :class:`~belayq.config.QueueConfig` field; these are not options.
They are named here so that a reader finds every bound the core keeps in one place.
"""

from __future__ import annotations

# -- claims ------------------------------------------------------------------------------

CLAIM_NONCE_BYTES = 8
"""Random bytes of a claim's nonce, which is also the call's request id (the reply memo
answers a re-sent claim with it): 64 bits, so two calls within the reply window never
share one."""

PAUSED_DUE_MS = -2
"""The ``next_due_ms`` a claim script answers while its queue is paused
(lua/includes/claiming.lua): nothing was claimed, and the claimer waits on the queue's
unpaused list instead of its ready list until a resume rings the bell there."""

HOLDER_REFRESH_S = 60.0
"""How often a consumer registers its host and pid again (s, on its next claim): its record
stays among the newest :data:`CONSUMERS_KEPT`, and a record lost with a server comes back."""

CONSUMERS_KEPT = 1000
"""Most consumer records (host, pid) a queue keeps, newest first: a fleet that restarts
its processes often leaves the older records behind, and a lease whose holder's record was
dropped shows no host and pid."""

HOLDER_RETRY_S = 5.0
"""How long a consumer whose registration failed (a full server, an ACL without the
commands) waits before trying again (s); its claims go on meanwhile."""

BLOCK_ROUND_MAX_S = 4.0
"""Longest single BLMOVE wait of :meth:`~belayq.ReliableQueue.claim` (s): a waiting claim
looks at due delayed messages and at a closed queue at least this often."""

BLOCK_ROUND_MIN_S = 0.01
"""Shortest BLMOVE wait (s); Redis reads 0 as "wait forever"."""

BLOCK_SHARE_OF_SOCKET_TIMEOUT = 0.8
"""Share of the client's socket timeout one BLMOVE may wait: the reply must come before
redis-py gives up on the socket."""

REDIS_PY_READ_TIMEOUT_S = 5.0
"""The read timeout redis-py 8 applies when a pool names no ``socket_timeout`` (s)."""

WAIT_FOREVER_ROUND_S = 3600.0
"""``claim(timeout=None)`` waits in rounds of at most this (each further capped by
``BLOCK_ROUND_MAX_S``) until a message comes (s)."""

CLAIM_ANY_ROUND_MAX_S = 60.0
"""Longest blocking round of :func:`~belayq.claim_any.claim_any` (s): a dead socket cannot
hang a worker for longer."""

CANCEL_GRACE_S = 5.0
"""How long a cancelled blocking claim may take to answer before its connection is
closed (s)."""

# -- recovery and administration ----------------------------------------------------------

SWEEP_BATCH = 1000
"""Most expired leases, landing entries and due delayed messages one explicit sweep
handles: one script stays around a millisecond, never O(messages in flight); the next
sweep, one period later, takes the rest."""

PURGE_BATCH = 1000
"""Messages one purge script removes before it returns and is called again, so a purge of
a million messages never blocks the server for long."""

AOF_ACK_PROBE_MS = 100
"""Longest WAIT sent before a WAITAOF that counts replicas (ms), in the same round trip. A
replica answers the primary's ack request as it reads it, before its own fsync; a request
that arrives with the write itself is answered with the fsync not yet done, and the replica
says more only once a second. The WAIT makes that first exchange happen, so the WAITAOF's
request comes after the replica's fsync (with ``appendfsync always``: within a millisecond,
not a second)."""

CLUSTER_RETRY_FIRST_PAUSE_S = 0.02
"""First pause before a call whose cluster slot is migrating is tried again (s)."""

CLUSTER_RETRY_MAX_PAUSE_S = 0.5
"""Longest such pause (the pause doubles up to it) (s)."""

# -- stored text ----------------------------------------------------------------------------

REASON_MAX_CHARS = 500
"""Longest reason (a nack's or a dead letter's) kept with a message: a traceback passed as
the reason must not grow every message's record by kilobytes."""

RESULT_MAX_BYTES = 1024
"""Longest result an ack keeps in the done history (``history_max``), as the payload's first
bytes there are: the history is a window for an operator, not a result store."""

BELL_SCAN = 1000
"""How far from the head of the first ready list the bell is looked for when counting what
is ready (stats, metrics, Flower). It is rung into an empty list and only hand-backs are
pushed before it, so it sits near the head; a bounded scan keeps a count O(1) in the
queue's length (stats.lua holds the same number)."""

TRACE_CONTEXT_MAX_BYTES = 8192
"""Longest trace context kept with a message (bytes of its W3C headers as JSON; publish.lua
holds the same number): a longer one is not stored, and its messages are published
untraced, counted in the queue's ``untraced`` counter."""
