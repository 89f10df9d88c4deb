"""Loads the Lua scripts from ``lua/`` and runs them with EVALSHA (reloading on NOSCRIPT).

Each script file is one transition; ``-- @include name`` pastes ``lua/lib/name.lua`` in.
Every script takes the same KEYS vector and the same first four ARGV (see
``lua/lib/common.lua``); :class:`ScriptRunner` adds both, so callers pass only the
script-specific arguments.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from .config import QueueConfig
from .keys import QueueKeys

Arg = str | bytes | int | float

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)
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


@cache
def source(name: str) -> str:
    """The full text of script ``name`` with its includes pasted in."""
    lua = resources.files("belayq") / "lua"
    text = (lua / f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: (lua / "lib" / f"{m.group(1)}.lua").read_text("utf-8"), text)


@cache
def sha(name: str) -> str:
    """SHA1 of script ``name`` as Redis computes it for EVALSHA."""
    return hashlib.sha1(source(name).encode("utf-8")).hexdigest()


class ScriptRunner:
    """Runs belayq's scripts for one queue on one client.

    Args:
        client: A ``redis.Redis``, ``redis.cluster.RedisCluster`` or fakeredis client.
        keys: The queue's keys.
        config: The queue's configuration.
    """

    def __init__(self, client: Any, keys: QueueKeys, config: QueueConfig) -> None:
        self.client = client
        self.keys_vector: list[str] = [
            keys.processing,
            keys.leases,
            keys.delayed,
            keys.dead,
            keys.stats,
            keys.sweep_guard,
            *keys.levels,
        ]
        self.config = config
        self.skew_ms = 0  # tests move the queue's clock with this; always 0 in production

    def common_args(self, request_id: str = "") -> list[Arg]:
        c = self.config
        inline = (
            ("1" if c.payload_in_list else "0")
            + ("L" if c.ready_head == "left" else "")
            + ("" if c.bell else "N")
        )
        return [self.skew_ms, inline, c.max_deliveries, c.dead_letter_max, request_id]

    def load_all(self) -> None:
        """Load every script into the server's cache (on every primary of a cluster)."""
        for name in SCRIPT_NAMES:
            self.client.script_load(source(name))

    def run(self, name: str, *args: Arg, request_id: str = "") -> Any:
        """Run script ``name`` with the queue's keys; reload it once on NOSCRIPT.

        A ``request_id`` makes a re-sent call (after a dropped connection) return the first
        run's reply instead of running again; see ``lua/lib/common.lua``.
        """
        argv = [*self.common_args(request_id), *args]
        n = len(self.keys_vector)
        try:
            return self.client.evalsha(sha(name), n, *self.keys_vector, *argv)
        except NoScriptError:
            # The server lost its script cache (restart, SCRIPT FLUSH): reload them all, so
            # the EVALSHAs that queue_on puts in callers' transactions find theirs too.
            self.load_all()
            return self.client.evalsha(sha(name), n, *self.keys_vector, *argv)

    def run_many(self, *calls: tuple[str, list[Arg], str]) -> list[Any]:
        """Run several scripts in one round trip (a pipeline, not a transaction): each call
        is ``(name, args, request_id)``; the replies in order. Reloads once on NOSCRIPT (a
        script that found its cache empty ran nothing; request ids make the rest idempotent).
        """
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for name, args, request_id in calls:
                self.queue_on(pipe, name, *args, request_id=request_id)
            try:
                return list(pipe.execute())
            except NoScriptError:
                if attempt == 2:
                    raise
                self.load_all()
        raise AssertionError("unreachable")

    def queue_on(self, pipeline: Any, name: str, *args: Arg, request_id: str = "") -> None:
        """Queue script ``name`` on the caller's pipeline (EVALSHA; no SCRIPT EXISTS)."""
        n = len(self.keys_vector)
        common = self.common_args(request_id)
        pipeline.execute_command("EVALSHA", sha(name), n, *self.keys_vector, *common, *args)
