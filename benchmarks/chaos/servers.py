"""The two redis-servers of a run: the broker (AOF, ``appendfsync always``, restartable on
the same port and directory) and the ledger (never faulted). Both on free ports, never
6379, and both removed at the end."""

from __future__ import annotations

import contextlib
import signal
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from belayq.embedded import RedisServer, redis_server_binary, system_redis_server


def binary() -> str:
    return system_redis_server() or redis_server_binary()


class BrokerServer(RedisServer):
    """A redis-server with ``appendonly yes`` / ``appendfsync always`` that can be killed
    and started again on the same port and directory (the AOF brings every write back)."""

    def __init__(self) -> None:
        super().__init__(
            binary(),
            args=["--appendonly", "yes", "--appendfsync", "always", "--save", ""],
        )
        self.restarts = 0

    def run_id(self) -> str:
        client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            return str(client.info("server")["run_id"])
        finally:
            client.close()

    def restart(self, how: str) -> dict[str, object]:
        """Stop the server (``how``: ``"sigkill"`` or ``"shutdown-nosave"``) and start it
        again on the same port and directory. Returns what happened, for the fault log."""
        assert self.proc is not None
        before = self.run_id()
        old_pid = self.proc.pid
        t0 = time.time()
        if how == "shutdown-nosave":
            # No retry: redis-py would re-send SHUTDOWN to the dead server with backoff for
            # seconds, and the outage would be that long instead of the restart's.
            client = redis.Redis(port=self.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))
            with contextlib.suppress(redis.ConnectionError):
                client.shutdown(nosave=True)
            client.close()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(10)
        else:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        down = time.time()
        exit_code = self.proc.returncode
        self.start()
        after = self.run_id()
        self.restarts += 1
        return {
            "how": how,
            "old_pid": old_pid,
            "old_exit": exit_code,
            "new_pid": self.proc.pid,
            "old_run_id": before,
            "new_run_id": after,
            "down_s": round(time.time() - down, 3),
            "stop_s": round(down - t0, 3),
            "outage_s": round(time.time() - t0, 3),
            "verified": exit_code is not None and before != after and old_pid != self.proc.pid,
        }


class LedgerServer(RedisServer):
    """The ledger's redis-server: no persistence needed, never faulted."""

    def __init__(self) -> None:
        super().__init__(binary())
