"""A throwaway primary with replicas watched by Redis Sentinels, on free ports."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .server import (
    RedisServer,
    _answers_ping,
    _info,
    _poll,
    _stop,
    _text,
    free_port,
    redis_server_binary,
    spawn,
)


def redis_sentinel_command(binary: str | None = None) -> list[str]:
    """The command that starts a Sentinel of the same server as ``binary``: the sentinel
    program installed beside it (``redis-sentinel`` beside ``redis-server``,
    ``valkey-sentinel`` beside ``valkey-server``), else that server in sentinel mode
    (``<binary> --sentinel``). Without ``binary``: ``redis-sentinel`` on PATH first, then
    as for :func:`redis_server_binary`'s choice.

    Raises:
        ConfigError: No redis-server at all (see :func:`redis_server_binary`).
    """
    candidates = [] if binary else [shutil.which("redis-sentinel")]
    server = binary or redis_server_binary()
    name = Path(server).name
    if name.endswith("-server"):
        candidates.append(str(Path(server).with_name(name[: -len("server")] + "sentinel")))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return [candidate]
    return [server, "--sentinel"]


class RedisSentinel:
    """One Redis Sentinel process on 127.0.0.1, watching ``service_name`` on ``primary_port``.

    Its configuration file (which Sentinel rewrites as it learns) lives in a temporary
    directory of its own, removed on :meth:`stop`.
    """

    def __init__(
        self,
        command: list[str],
        service_name: str,
        primary_port: int,
        *,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.command = list(command)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="belayq-sentinel-"))
        self.proc: subprocess.Popen[bytes] | None = None
        name = service_name
        (self.dir / "sentinel.conf").write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            "daemonize no\n"
            f"dir {self.dir}\n"
            f"logfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
            f"sentinel failover-timeout {name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 2\n"
        )

    def log(self) -> str:
        path = self.dir / "sentinel.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> RedisSentinel:
        """Start the Sentinel and wait until it answers PING (10 s at most)."""
        # The configuration file comes first (``redis-server <file> --sentinel``).
        self.proc = spawn([self.command[0], str(self.dir / "sentinel.conf"), *self.command[1:]])
        atexit.register(self.stop)
        if not _answers_ping(self.proc, self.port, 10.0):
            log = self.log()[-2000:]
            self.stop()
            raise RuntimeError(f"the sentinel did not answer on port {self.port}: {log}")
        return self

    def stop(self) -> None:
        """Stop the Sentinel (SIGTERM, then SIGKILL) and remove its directory."""
        _stop(self.proc)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisSentinelServers:
    """A primary, ``replicas`` replicas of it (``--replicaof``) and ``sentinels`` Redis
    Sentinels watching them as ``service_name``, on free ports of 127.0.0.1.

    Sentinel marks the primary down after ``down_after_ms`` without an answer and promotes
    a replica (``quorum`` sentinels must agree); clients that ask the sentinels
    (``redis.sentinel.Sentinel(self.sentinel_addresses).master_for(self.service_name)``)
    then reach the new primary. :meth:`kill_primary` and :meth:`wait_for_new_primary` run
    a failover. The data servers keep nothing on disk (no RDB, no AOF), as
    :class:`RedisServer`.

    Args:
        binary: The redis-server to run (default: :func:`redis_server_binary`).
        sentinel_command: The command that starts a Sentinel (default:
            :func:`redis_sentinel_command`).
        service_name: The name the sentinels monitor the primary under.
        replicas: How many replicas the primary starts with.
        sentinels: How many sentinels watch them.
        quorum: How many sentinels must agree that the primary is down.
        down_after_ms: Silence after which a sentinel deems a server down (ms).
        failover_timeout_ms: Sentinel's ``failover-timeout`` (ms): a failover that stalls
            is abandoned after it, and the next one waits twice that long.
        args: Extra ``--option value`` arguments of every data server.
    """

    def __init__(
        self,
        binary: str | None = None,
        sentinel_command: list[str] | None = None,
        *,
        service_name: str = "belayq",
        replicas: int = 2,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        args: list[str] | None = None,
    ) -> None:
        self.binary = binary or redis_server_binary()
        self.service_name = service_name
        # No 5 s wait for more replicas before a (diskless) full sync, on every server:
        # any of them may become the primary.
        extra = ["--repl-diskless-sync-delay", "0", *(args or [])]
        self.servers = [RedisServer(self.binary, args=list(extra))]
        primary_port = self.servers[0].port
        self.servers += [
            RedisServer(self.binary, args=[*extra, "--replicaof", "127.0.0.1", str(primary_port)])
            for _ in range(replicas)
        ]
        command = sentinel_command or redis_sentinel_command(self.binary)
        self.sentinels = [
            RedisSentinel(
                command,
                service_name,
                primary_port,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for _ in range(sentinels)
        ]

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel, as ``redis.sentinel.Sentinel`` takes them."""
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def start(self, timeout: float = 60.0) -> RedisSentinelServers:
        """Start the servers and the sentinels; return once every replica's link is up and
        every sentinel sees every replica and every other sentinel (``timeout`` s at most;
        a sentinel learns of replicas from the primary's INFO, every 10 s)."""
        try:
            for server in self.servers:
                server.start()
            for sentinel in self.sentinels:
                sentinel.start()
            _poll(self._settled, timeout, "the replicas to sync and the sentinels to meet",
                  self._unsettled)
        except BaseException:
            self.stop()
            raise
        return self

    def _settled(self) -> bool:
        replicas, others = len(self.servers) - 1, len(self.sentinels) - 1
        for server in self.servers[1:]:
            info = _info(server.port, "replication")
            if info.get("master_link_status") != "up" or int(
                info.get("master_sync_in_progress", 0)
            ):
                return False
        for sentinel in self.sentinels:
            state = self._sentinel_view(sentinel.port)
            if state is None:
                return False
            if int(str(state.get("num-slaves", 0))) < replicas:
                return False
            if int(str(state.get("num-other-sentinels", 0))) < others:
                return False
        return True

    def _unsettled(self) -> str:
        """What each replica and sentinel reports, for a start that timed out."""
        lines = []
        for server in self.servers[1:]:
            info = _info(server.port, "replication")
            lines.append(f"replica {server.port}: link {info.get('master_link_status')}, "
                         f"sync in progress {info.get('master_sync_in_progress')}")
        for sentinel in self.sentinels:
            state = self._sentinel_view(sentinel.port)
            seen = "no answer" if state is None else (
                f"replicas {state.get('num-slaves')}, other sentinels "
                f"{state.get('num-other-sentinels')}, flags {state.get('flags')}")
            lines.append(f"sentinel {sentinel.port}: {seen}")
        return "\n".join(lines)

    def _sentinel_view(self, port: int) -> dict[str, object] | None:
        import redis

        with redis.Redis(port=port, socket_timeout=2) as sentinel:
            try:
                view: dict[str, object] = sentinel.sentinel_master(self.service_name)
            except redis.RedisError:
                return None
        return view

    def master_address(self) -> tuple[str, int]:
        """The primary's ``(host, port)`` as the first sentinel that answers reports it.

        Raises:
            RuntimeError: No sentinel answered.
        """
        import redis

        for sentinel in self.sentinels:
            with redis.Redis(port=sentinel.port, socket_timeout=2) as client:
                try:
                    host, port = client.sentinel_get_master_addr_by_name(self.service_name)
                except (redis.RedisError, TypeError, ValueError):
                    continue
            return _text(host), int(port)
        raise RuntimeError(f"no sentinel knows the primary of {self.service_name!r}")

    def server_at(self, port: int) -> RedisServer:
        """The data server listening on ``port``."""
        for server in self.servers:
            if server.port == port:
                return server
        raise KeyError(port)

    @property
    def primary(self) -> RedisServer:
        """The data server the sentinels currently name as the primary."""
        return self.server_at(self.master_address()[1])

    def kill_primary(self) -> tuple[str, int]:
        """SIGKILL the current primary (no shutdown, nothing saved; its directory stays) and
        return the address it had."""
        address = self.master_address()
        server = self.server_at(address[1])
        if server.proc is not None:
            server.proc.kill()
            server.proc.wait(10)
            server.proc = None
        return address

    def wait_for_new_primary(
        self, old: tuple[str, int], *, replicas: int = 0, timeout: float = 30.0
    ) -> tuple[str, int]:
        """Wait until every sentinel names a primary other than ``old``, that server says it
        is a primary, and at least ``replicas`` replicas are online with it; return its
        address.

        Raises:
            AssertionError: Not within ``timeout`` s (the message has the sentinels' logs).
        """

        def promoted() -> tuple[str, int] | None:
            seen = set()
            for sentinel in self.sentinels:
                view = self._sentinel_view(sentinel.port)
                if view is None:
                    return None
                seen.add((_text(view.get("ip")), int(_text(view.get("port")))))
            if len(seen) != 1 or old in seen:
                return None
            address = seen.pop()
            info = _info(address[1], "replication")
            if info.get("role") != "master":
                return None
            online = sum(
                1
                for k, v in info.items()
                if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
            )
            return address if online >= replicas else None

        def logs() -> str:
            return "\n".join(s.log()[-1500:] for s in self.sentinels)

        found: tuple[str, int] = _poll(promoted, timeout, "a new primary", logs)
        return found

    def stop(self) -> None:
        """Stop every sentinel and server and remove their directories."""
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> RedisSentinelServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


