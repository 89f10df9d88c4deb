"""Runs the Lua transitions (built by :mod:`belayq.sources`): as functions of belayq's Redis
FUNCTION library (FCALL, Redis 7.0+ on one server) or as scripts (EVALSHA), each with the
key vector its contract block names. As a library the includes are defined once when it
loads; as a script, on every call.

The transitions survive a server that lost them (restart, failover, ``SCRIPT FLUSH``,
``FUNCTION FLUSH``): a call that finds its script or function missing ran nothing, so the
library or scripts are loaded again and the call runs again. A call queued in the caller's
own transaction (RQ's MULTI) is sent as EVAL with the script's text, which no loss can fail.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import client_info
from .config import QueueConfig
from .constants import (
    CLUSTER_RETRY_FIRST_PAUSE_S,
    CLUSTER_RETRY_MAX_PAUSE_S,
)
from .durable import Arg as Arg  # the scripts' argument type, named here for the callers
from .durable import DurableWrites
from .errors import (
    CLUSTER_ERROR,
    CONNECTION_ERROR,
    NO_PERMISSION,
    NO_SCRIPT,
    REDIRECTS,
    RESPONSE_ERROR,
    ConfigError,
    ConnectionLost,
)
from .keys import QueueKeys
from .sent import Sent, pool_connection
from .sources import SCRIPT_NAMES, key_roles, library, memoized, sha, source

#: What a cluster client meets while a master fails over: its node refuses connections
#: (killed) or stops answering, until a replica takes its slots over. redis-py retries a
#: few times within a second; a failover takes ``cluster-node-timeout`` and more. A call
#: that may have run is safe to send again: publishes and claims answer a re-sent request
#: id from their reply memo, settles are fenced by the claim's token.
_FAILING_OVER = (*CONNECTION_ERROR, *CLUSTER_ERROR)  # CLUSTER_ERROR: SlotNotCoveredError...


def request_id() -> str:
    """A fresh request id: a call redis-py re-sends after a dropped connection answers from
    the reply memo as its first run did (64 random bits: no two calls within the reply
    window share one)."""
    return os.urandom(8).hex()


def _lost_scripts(reply: Any) -> bool:
    """Whether a reply says the server has lost belayq's scripts or library (restart,
    failover, SCRIPT FLUSH, FUNCTION FLUSH): the call ran nothing."""
    return isinstance(reply, NO_SCRIPT) or (
        isinstance(reply, RESPONSE_ERROR) and str(reply).startswith("Function not found")
    )


def refresh_slots(client: Any) -> None:
    """Ask a cluster client to learn the slot map again (after a failover or a slot move);
    a node that does not answer yet is left for the next try."""
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return
    try:
        manager.initialize()
    except (*REDIRECTS, *_FAILING_OVER):
        pass


def _layout_of(c: QueueConfig) -> str:
    """The scripts' mode flags that follow from the queue's configuration (the events
    flag is added per call, see ``ScriptRunner._mode``)."""
    return (
        ("1" if c.payload_in_list else "0")
        + ("L" if c.ready_head == "left" else "")
        + ("" if c.bell else "N")
        + ("T" if c.transient else "")
        + (f"H{c.history_max},{c.history_ttl_ms}" if c.history_max else "")
    )


class ScriptRunner(DurableWrites):
    """Runs belayq's scripts for one queue on one client.

    Args:
        client: A ``redis.Redis``, ``redis.cluster.RedisCluster`` or fakeredis client.
        keys: The queue's keys.
        config: The queue's configuration.
    """

    def __init__(self, client: Any, keys: QueueKeys, config: QueueConfig) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self.skew_ms = 0  # tests move the queue's clock with this; always 0 in production
        self.vectors = {n: self._vector(n) for n in SCRIPT_NAMES}
        self.cluster = client_info.is_cluster(client)
        self.wait_command: tuple[Arg, ...] | None = None  # see wait_for_replicas
        self._ack_probe: tuple[Arg, ...] | None = None  # a WAIT before the WAITAOF
        # FCALL of belayq's function library (Redis 7.0+, one server) or EVALSHA; decided
        # on the first call (see _pick_functions).
        self._functions: bool | None = None if config.lua_functions is not False else False
        self.server_versions: list[str] = []  # set by the queue ([]: fakeredis, unknown)
        #: Makes the request id of a call whose caller names none (tests make them known).
        self.new_request_id: Callable[[], str] = request_id
        self._layout = _layout_of(config)

    def reconfigure(self, config: QueueConfig) -> None:
        """Run the scripts with ``config`` from now on (the queue adopted recorded values)."""
        self.config = config
        self._layout = _layout_of(config)

    @property
    def sharded_events(self) -> bool:
        """Whether events go out with SPUBLISH (every server Redis 7.0+: sharded pub/sub,
        which a cluster routes to the queue's slot) rather than PUBLISH."""
        versions = self.server_versions
        return bool(versions) and all(client_info.version_tuple(v) >= (7,) for v in versions)

    @property
    def _mode(self) -> str:
        if not self.config.events:
            return self._layout
        return self._layout + ("ES" if self.sharded_events else "E")

    def _request_id(self, name: str, given: str) -> str:
        """The request id a call of script ``name`` goes with: the caller's, else a fresh
        one when the script keeps a reply memo (``-- MEMO: reply``), so no caller can
        forget it."""
        return given or (self.new_request_id() if memoized(name) else "")

    def _vector(self, name: str) -> list[str]:
        return [k for role in key_roles(name) for k in self.keys.role(role)]

    def common_args(self, request_id: str = "") -> list[Arg]:
        c = self.config
        return [
            self.skew_ms,
            self._mode,
            c.dead_after_runs,
            c.dead_letter_max,
            "" if c.transient else request_id,  # a transient queue keeps no reply memo
            c.reply_window_ms,
        ]

    def _command(self, name: str, args: Sequence[Arg], request_id: str) -> list[Arg]:
        if self._functions is None:
            self._functions = self._pick_functions()
        keys = self.vectors[name]
        head: list[Arg] = (
            ["FCALL", f"{library()[0]}_{name}"] if self._functions else ["EVALSHA", sha(name)]
        )
        return [*head, len(keys), *keys, *self.common_args(request_id), *args]

    def _pick_functions(self) -> bool:
        """Whether to call belayq's function library: on one server (a cluster would need
        it on every node, and redis-py a key lookup per FCALL) that runs Redis 7.0+. The
        library is loaded by the first call that finds it missing; a client that may not
        load or call it falls back to scripts then (see _reload)."""
        versions = [] if self.cluster else self.server_versions
        able = bool(versions) and all(client_info.version_tuple(v) >= (7,) for v in versions)
        if self.config.lua_functions and not able:
            raise ConfigError(
                "lua_functions=True needs one Redis 7.0+ server (not a cluster, not fakeredis)"
            )
        return able

    def _recoverable(self, reply: Any) -> bool:
        """A reply that ran nothing and that loading (or falling back to scripts) cures."""
        if _lost_scripts(reply):
            return True
        return bool(self._functions) and isinstance(reply, NO_PERMISSION)

    def _reload(self, reply: Any = None) -> None:
        """Load the library (or the scripts) after a call found them missing. A client that
        the server refuses FCALL or FUNCTION LOAD (an ACL user without them, a proxy) uses
        scripts from then on, unless ``lua_functions=True``."""
        if self._functions is None:  # loaded before the first call: pick what it will run
            self._functions = self._pick_functions()
        if not self._functions:
            self._load_scripts()
            return
        refusal: Exception | None = None
        if isinstance(reply, NO_PERMISSION):
            refusal = reply
        else:
            try:
                self.client.execute_command("FUNCTION", "LOAD", library()[1])
            except RESPONSE_ERROR as exc:
                if "already exists" in str(exc):  # another process loaded it meanwhile
                    return
                refusal = exc
        if refusal is None:
            return
        if self.config.lua_functions:
            raise ConfigError(f"lua_functions=True, but the library cannot run: {refusal}")
        self._functions = False
        self._load_scripts()

    def _load_scripts(self) -> None:
        for name in SCRIPT_NAMES:
            self.client.script_load(source(name))

    def load_all(self) -> None:
        """Load the library, or every script into the server's cache (on every primary of
        a cluster)."""
        self._reload()

    def run(self, name: str, *args: Arg, request_id: str = "", durable: bool = False) -> Any:
        """Run script ``name`` with the queue's keys.

        Loads the library or scripts and runs again when the server lost them; retries
        for up to ``cluster_retry_ms`` while a cluster slot migrates (TRYAGAIN, ASK,
        MOVED) or its master fails over (connection errors, CLUSTERDOWN), refreshing the
        slot map between tries. With ``durable`` and ``wait_replicas`` set, waits for the
        replicas in the same round trip.

        Raises:
            DurabilityError: Fewer replicas confirmed the write than asked.
            ConnectionLost: A slot migration or failover outlasted ``cluster_retry_ms``.
        """
        durable = durable and self.wait_command is not None
        rid = self._request_id(name, request_id)  # one id for every try: the same call
        return self._retrying(lambda: self._run_once(name, args, rid, durable))

    def _run_once(self, name: str, args: Sequence[Arg], request_id: str, durable: bool) -> Any:
        for attempt in (1, 2):
            command = self._command(name, args, request_id)
            if durable:
                reply, confirmed = self._send_durable(command)
            else:
                try:
                    reply = self.client.execute_command(*command)
                except RESPONSE_ERROR as exc:
                    reply = exc
            if attempt == 1 and self._recoverable(reply):
                self._reload(reply)
                continue
            if isinstance(reply, Exception):
                raise reply
            if durable:
                self._check_durable(confirmed)
            return reply
        raise AssertionError("unreachable")

    def _node_client(self) -> Any:
        if not self.cluster:
            return self.client
        node = self.client.get_node_from_key(self.keys.ready)
        return self.client.get_redis_connection(node)

    def _retrying(self, call: Callable[[], Any]) -> Any:
        if not self.cluster:
            return call()
        deadline = time.monotonic() + self.config.cluster_retry_ms / 1000
        pause = CLUSTER_RETRY_FIRST_PAUSE_S
        while True:
            try:
                return call()
            except (*REDIRECTS, *_FAILING_OVER) as exc:
                if time.monotonic() >= deadline:
                    raise ConnectionLost(
                        f"this queue's cluster slot stayed redirected or unreachable for "
                        f"{self.config.cluster_retry_ms} ms (a slot migration or a failover "
                        f"that does not finish?): {exc}"
                    ) from exc
                time.sleep(pause)
                pause = min(pause * 2, CLUSTER_RETRY_MAX_PAUSE_S)
                refresh_slots(self.client)

    def send(self, name: str, *args: Arg) -> Sent | None:
        """Send script ``name`` on a connection of its own and return without waiting for
        the reply; :meth:`Sent.reply` reads it later. Once this returns, the command is in
        the kernel's hands: it reaches the server even if this process is killed next (the
        connection has nothing unread, so closing it sends what is queued). None on a
        cluster client, whose connections redis-py keeps per node: the caller runs it.

        Raises:
            redis.ConnectionError: The command could not be sent (nothing was run).
        """
        if self.cluster:
            return None
        pool = self.client.connection_pool
        conn = pool_connection(pool)
        try:
            conn.send_command(*self.command(name, *args))
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        return Sent(self, pool, conn, name, args)

    def command(self, name: str, *args: Arg) -> list[Arg]:
        """Script ``name`` as a command the caller sends on a connection of its own (no
        reply memo); hand the reply to :meth:`answer`."""
        return self._command(name, args, "")

    def answer(self, name: str, args: Sequence[Arg], reply: Any) -> Any:
        """The reply of :meth:`command`'s call (an error reply as the exception): raised
        when it is an error, except that a call that found its script or library missing
        ran nothing, so it is loaded and the call runs again here, waiting this time."""
        if self._recoverable(reply):
            self._reload(reply)
            return self._run_once(name, args, "", False)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def run_many(self, *calls: tuple[str, list[Arg], str]) -> list[Any]:
        """Run several scripts in one round trip (a pipeline, not a transaction): each call
        is ``(name, args, request_id)``; the replies in order. A call that found its script
        or function missing ran nothing: they are reloaded and that call alone runs again."""
        calls = tuple((name, args, self._request_id(name, rid)) for name, args, rid in calls)

        def once() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for name, args, rid in calls:
                pipe.execute_command(*self._command(name, args, rid))
            replies = list(pipe.execute(raise_on_error=False))
            for i, reply in enumerate(replies):
                if self._recoverable(reply):
                    name, args, rid = calls[i]
                    replies[i] = self._run_once(name, args, rid, False)
                elif isinstance(reply, Exception):
                    raise reply
            return replies

        return list(self._retrying(once))

    def queue_on(self, pipeline: Any, name: str, *args: Arg, request_id: str = "") -> None:
        """Queue script ``name`` on the caller's pipeline or transaction as EVAL with the
        script's text: it cannot fail with NOSCRIPT inside a MULTI the caller executes."""
        keys = self.vectors[name]
        rid = self._request_id(name, request_id)
        pipeline.execute_command(
            "EVAL", source(name), len(keys), *keys, *self.common_args(rid), *args
        )

    def run_once(self, name: str, *args: Arg, request_id: str = "") -> Any:
        """:meth:`run` without waiting for a cluster slot: one try (after reloading the
        library or scripts if the server lost them). A redirection or an unreachable node
        raises redis-py's error at once, for a caller that has other queues to serve
        meanwhile (:func:`belayq.claim_any`)."""
        return self._run_once(name, args, self._request_id(name, request_id), False)

