"""``belayq demo --web`` and ``examples/demo.py`` start a redis-server of their own; however
they are stopped (SIGTERM, as a service manager or ``kill`` does, or SIGKILL of the program
alone), that redis-server stops with them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from belayq.embedded import free_port
from tests.support import wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _gone(pid: int) -> bool:
    """The process ended (a zombie nobody reaped counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=1).ping())
    except redis.ConnectionError:
        return False


def _server_of(program: subprocess.Popen[str], port: int) -> int:
    """The pid of the program's redis-server (listening on ``port``)."""
    [pid] = wait_for(lambda: [p for p in _children(program.pid)
                              if "redis-server" in Path(f"/proc/{p}/cmdline").read_text()
                              and str(port) in Path(f"/proc/{p}/cmdline").read_text()],
                     10, "the redis-server child")
    return int(pid)


def _stops_with(program: subprocess.Popen[str], port: int, sig: signal.Signals) -> None:
    server = _server_of(program, port)
    assert _answers(port)
    try:
        program.send_signal(sig)
        program.wait(30)
        wait_for(lambda: _gone(server) and not _answers(port), 10,
                 f"the redis-server (pid {server}) to stop after {sig.name} of its program")
    finally:
        with contextlib.suppress(ProcessLookupError):  # left running: not by this test's run
            os.kill(server, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_demo_pages_redis_server_stops_with_it(sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BELAYQ_TOKEN"}
    demo = subprocess.Popen([sys.executable, "-m", "belayq", "demo", "--web", "--port",
                             str(free_port())], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert demo.stdout is not None
        banner = demo.stdout.readline()
        assert "belayq demo on" in banner, banner
        port = int(banner.split("redis://127.0.0.1:")[1].split("/")[0])
        _stops_with(demo, port, sig)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
    if sig == signal.SIGTERM:
        assert demo.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), demo.returncode


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_terminal_demos_redis_server_stops_with_it(sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    demo = subprocess.Popen([sys.executable, str(EXAMPLES / "demo.py")], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert demo.stdout is not None
        line = demo.stdout.readline()
        assert "embedded redis-server" in line, line
        _stops_with(demo, int(line.rsplit("port ", 1)[1]), sig)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
