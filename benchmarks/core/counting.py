"""The counting redis-py client and the measurement of one timed loop.

Round trips and top-level commands are counted client-side, per thread, by a redis-py
``Connection`` (a pipeline or a MULTI block is one round trip); every command the server
ran comes from ``INFO commandstats`` (commands inside Lua and the lease keeper's included).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

# thread name -> [round trips, top-level commands]; each thread only touches its own row.
_COUNTS: dict[str, list[int]] = {}


def _row() -> list[int]:
    name = threading.current_thread().name
    row = _COUNTS.get(name)
    if row is None:
        row = _COUNTS.setdefault(name, [0, 0])
    return row


class _CountingPacker:
    """Wraps redis-py's command packer: one ``pack`` = one command sent."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def pack(self, *args: Any) -> Any:
        _row()[1] += 1
        return self._inner.pack(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountingConnection(redis.Connection):
    """A redis-py connection that counts round trips (one ``send_packed_command`` = one
    write followed by reading the replies) and commands, per thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command_packer = _CountingPacker(self._command_packer)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        _row()[0] += 1
        super().send_packed_command(command, check_health)


def make_client(port: int) -> redis.Redis:
    # socket_timeout=5 is what redis.Redis(host, port) puts in the pool's kwargs itself; a
    # bare ConnectionPool leaves it out (the connection still times out reads at 5 s) and
    # belayq would then block in BLMOVE for as long as the read timeout (see the report).
    pool = redis.ConnectionPool(
        connection_class=CountingConnection, host="127.0.0.1", port=port,
        socket_timeout=5, socket_connect_timeout=5,
    )
    return redis.Redis(connection_pool=pool)


def counts(thread: str = "MainThread") -> tuple[int, int]:
    row = _COUNTS.get(thread, [0, 0])
    return row[0], row[1]


def server_calls(r: redis.Redis) -> tuple[int, int, int]:
    """Every command the server has run (INFO commandstats, Lua-internal calls included);
    the server usec of scripts and functions; the usec of all commands but INFO (which
    counts Lua-internal calls twice: use it where no script ran)."""
    info = r.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_"))
    lua = ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval")
    lua_usec = sum(int(info[k]["usec"]) for k in lua if k in info)
    all_usec = sum(int(v["usec"]) for k, v in info.items()
                   if k.startswith("cmdstat_") and not k.startswith("cmdstat_info"))
    return calls, lua_usec, all_usec


def server_cpu_s(r: redis.Redis) -> float:
    """The server process's CPU time so far (INFO cpu: user + system, every thread): the
    scripts, the commands and the socket I/O of every client."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class Sample:
    """One timed loop."""

    msgs: int
    seconds: float
    rate: float
    rt_per_msg: float
    cmds_per_msg: float
    server_cmds_per_msg: float
    keeper_rt: int
    server_usec_per_msg: float = 0.0
    server_cpu_us_per_msg: float = 0.0


def measure(r: redis.Redis, n: int, fn: Callable[[], None]) -> Sample:
    srv0, lua0, all0 = server_calls(r)
    cpu0 = server_cpu_s(r)
    rt0, cmd0 = counts()
    krt0, _ = counts("belayq-lease-keeper")
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    rt1, cmd1 = counts()
    krt1, _ = counts("belayq-lease-keeper")
    cpu1 = server_cpu_s(r)
    srv1, lua1, all1 = server_calls(r)
    # srv1 includes the first INFO commandstats and both INFO cpu; the client counters
    # exclude every INFO.
    return Sample(
        msgs=n,
        seconds=dt,
        rate=n / dt,
        rt_per_msg=(rt1 - rt0) / n,
        cmds_per_msg=(cmd1 - cmd0) / n,
        server_cmds_per_msg=(srv1 - srv0 - 3) / n,
        keeper_rt=krt1 - krt0,
        server_usec_per_msg=((lua1 - lua0) or (all1 - all0)) / n,
        server_cpu_us_per_msg=(cpu1 - cpu0) * 1e6 / n,
    )
