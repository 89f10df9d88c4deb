"""Loads the Lua scripts from ``lua/`` and runs them with EVALSHA.

Each script file is one transition and opens with its contract block. ``-- @include name``
lines paste ``lua/includes/name.lua`` in (each include once, its own includes first). The
``KEYS[i] <role>`` lines of the contract block are the script's key vector: the runner reads
them, so the keys each script is given and the keys its header names cannot drift apart.

Scripts survive a server that lost its script cache (restart, failover, ``SCRIPT FLUSH``):
every EVALSHA that answers NOSCRIPT reloads the scripts and runs again (a script that found
its cache empty ran nothing), and a call queued in the caller's own transaction (RQ's
MULTI) is sent as EVAL with the script's text, which no cache loss can fail. Why not Redis
FUNCTIONs: README, "Scripts and the script cache".
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.exceptions import NoScriptError

from . import client_info
from .config import QueueConfig
from .errors import ConnectionLost, DurabilityError
from .keys import QueueKeys

Arg = str | bytes | int | float

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)
_KEY = re.compile(r"KEYS\[(\d+)(\.\.)?\]\s+(\w+)")
_SAME_KEYS = re.compile(r"^-- KEYS: as (\w+)\.lua", re.MULTILINE)
SCRIPT_NAMES = (
    "publish",
    "claim",
    "lease",
    "ack",
    "nack",
    "extend",
    "release",
    "sweep",
    "replay",
    "purge",
    "drop",
    "stats",
)
#: Errors a cluster answers while a slot moves: the script ran nothing; run it again.
_REDIRECTS: tuple[type[Exception], ...] = tuple(
    getattr(redis.exceptions, n)
    for n in ("TryAgainError", "AskError", "MovedError", "ClusterDownError", "ClusterError")
    if hasattr(redis.exceptions, n)
)


def _lua_dir() -> Any:
    return resources.files("belayq") / "lua"


@cache
def source(name: str) -> str:
    """The full text of script ``name`` with its includes pasted in (each once)."""
    lua = _lua_dir()
    done: set[str] = set()

    def expand(text: str) -> str:
        def include(m: re.Match[str]) -> str:
            inc = m.group(1)
            if inc in done:
                return f"-- (included above: {inc})"
            done.add(inc)
            return expand((lua / "includes" / f"{inc}.lua").read_text("utf-8"))

        return _INCLUDE.sub(include, text)

    return expand((lua / f"{name}.lua").read_text(encoding="utf-8"))


@cache
def sha(name: str) -> str:
    """SHA1 of script ``name`` as Redis computes it for EVALSHA."""
    return hashlib.sha1(source(name).encode("utf-8")).hexdigest()


@cache
def key_roles(name: str) -> tuple[str, ...]:
    """The key roles of script ``name`` in KEYS order, from its contract block; ``levels``
    (always last) stands for every ready list."""
    text = (_lua_dir() / f"{name}.lua").read_text(encoding="utf-8")
    same = _SAME_KEYS.search(text)
    if same:
        return key_roles(same.group(1))
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    roles: dict[int, str] = {}
    for index, rest, role in _KEY.findall(header):
        roles[int(index)] = role
        if rest and role != "levels":
            raise ValueError(f"{name}.lua: only 'levels' may take KEYS[{index}..]")
    order = [roles[i] for i in sorted(roles)]
    if sorted(roles) != list(range(1, len(roles) + 1)):
        raise ValueError(f"{name}.lua: KEYS roles are not numbered 1..n: {roles}")
    return tuple(order)


class ScriptRunner:
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
        self.wait_command: tuple[Arg, ...] | None = None  # set by the queue (durability)
        c = config
        self._mode = (
            ("1" if c.payload_in_list else "0")
            + ("L" if c.ready_head == "left" else "")
            + ("" if c.bell else "N")
        )

    def _vector(self, name: str) -> list[str]:
        return [k for role in key_roles(name) for k in self.keys.role(role)]

    def common_args(self, request_id: str = "") -> list[Arg]:
        c = self.config
        return [
            self.skew_ms,
            self._mode,
            c.max_deliveries,
            c.dead_letter_max,
            request_id,
            c.reply_window_ms,
        ]

    def _argv(self, name: str, args: Sequence[Arg], request_id: str) -> list[Arg]:
        keys = self.vectors[name]
        c = self.config
        return [
            sha(name), len(keys), *keys, self.skew_ms, self._mode, c.max_deliveries,
            c.dead_letter_max, request_id, c.reply_window_ms, *args,
        ]

    def load_all(self) -> None:
        """Load every script into the server's cache (on every primary of a cluster)."""
        for name in SCRIPT_NAMES:
            self.client.script_load(source(name))

    def run(self, name: str, *args: Arg, request_id: str = "", durable: bool = False) -> Any:
        """Run script ``name`` with the queue's keys.

        Reloads the scripts and runs again on NOSCRIPT; retries for up to
        ``cluster_retry_ms`` while a cluster slot migrates (TRYAGAIN, ASK, MOVED).
        With ``durable`` and ``wait_replicas`` set, waits for the replicas in the same
        round trip.

        Raises:
            DurabilityError: Fewer replicas confirmed the write than asked.
            ConnectionLost: A slot migration outlasted ``cluster_retry_ms``.
        """
        argv = self._argv(name, args, request_id)
        if durable and self.wait_command is not None:
            return self._retrying(lambda: self._run_durable(argv))
        return self._retrying(lambda: self._evalsha(argv))

    def _evalsha(self, argv: list[Arg]) -> Any:
        try:
            return self.client.execute_command("EVALSHA", *argv)
        except NoScriptError:
            self.load_all()
            return self.client.execute_command("EVALSHA", *argv)

    def _run_durable(self, argv: list[Arg]) -> Any:
        assert self.wait_command is not None
        node = self._node_client()
        for attempt in (1, 2):
            pipe = node.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", *argv)
            pipe.execute_command(*self.wait_command)
            reply, confirmed = pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError) and attempt == 1:
                self.load_all()
                continue
            if isinstance(reply, Exception):
                raise reply
            self._check_durable(confirmed)
            return reply
        raise AssertionError("unreachable")

    def _check_durable(self, confirmed: Any) -> None:
        wanted = self.config.wait_replicas
        if isinstance(confirmed, Exception):
            raise DurabilityError(f"could not wait for {wanted} replica(s): {confirmed}")
        if isinstance(confirmed, list):  # WAITAOF: [local fsyncs, replica fsyncs]
            local, replicas = int(confirmed[0]), int(confirmed[1])
            if local < 1 or replicas < wanted:
                raise DurabilityError(
                    f"the write is on the primary, but only {replicas} of {wanted} replica(s) "
                    f"{'and not the primary ' if local < 1 else ''}confirmed it on disk within "
                    f"{self.config.wait_timeout_ms} ms: a failover now could lose it"
                )
            return
        if int(confirmed) < wanted:
            raise DurabilityError(
                f"the write is on the primary, but only {int(confirmed)} of {wanted} "
                f"replica(s) confirmed it within {self.config.wait_timeout_ms} ms: a failover "
                "now could lose it"
            )

    def _node_client(self) -> Any:
        if not self.cluster:
            return self.client
        node = self.client.get_node_from_key(self.keys.ready)
        return self.client.get_redis_connection(node)

    def _retrying(self, call: Callable[[], Any]) -> Any:
        if not self.cluster:
            return call()
        deadline = time.monotonic() + self.config.cluster_retry_ms / 1000
        pause = 0.02
        while True:
            try:
                return call()
            except _REDIRECTS as exc:
                if time.monotonic() >= deadline:
                    raise ConnectionLost(
                        f"the cluster kept redirecting this queue's slot for "
                        f"{self.config.cluster_retry_ms} ms (a slot migration that does not "
                        f"finish?): {exc}"
                    ) from exc
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                if hasattr(self.client, "nodes_manager"):
                    self.client.nodes_manager.initialize()

    def run_many(self, *calls: tuple[str, list[Arg], str]) -> list[Any]:
        """Run several scripts in one round trip (a pipeline, not a transaction): each call
        is ``(name, args, request_id)``; the replies in order. A call that answered NOSCRIPT
        ran nothing: the scripts are reloaded and that call alone is run again."""
        argvs = [self._argv(name, args, rid) for name, args, rid in calls]

        def once() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for argv in argvs:
                pipe.execute_command("EVALSHA", *argv)
            replies = list(pipe.execute(raise_on_error=False))
            for i, reply in enumerate(replies):
                if isinstance(reply, NoScriptError):
                    self.load_all()
                    replies[i] = self.client.execute_command("EVALSHA", *argvs[i])
                elif isinstance(reply, Exception):
                    raise reply
            return replies

        return list(self._retrying(once))

    def queue_on(self, pipeline: Any, name: str, *args: Arg, request_id: str = "") -> None:
        """Queue script ``name`` on the caller's pipeline or transaction as EVAL with the
        script's text: it cannot fail with NOSCRIPT inside a MULTI the caller executes."""
        keys = self.vectors[name]
        pipeline.execute_command(
            "EVAL", source(name), len(keys), *keys, *self.common_args(request_id), *args
        )
