"""A throwaway Redis Cluster (masters, optionally one replica each) on free ports."""

from __future__ import annotations

import time
from typing import Any

from ..errors import ConfigError
from .server import RedisServer, free_port, redis_server_binary


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
    :meth:`master_of_key` and :meth:`replica_of` ask the cluster. A node stopped with
    :meth:`kill` starts again with ``node.start()`` (same port and directory, so the same
    node id); a master that was failed over meanwhile rejoins as a replica. The nodes keep
    no data on disk: a killed master restarted *before* its replica took over comes back
    empty and still a master (what a self-run cluster without persistence risks too).
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
                self._wait(self._all_met, "every node to meet the others")
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

    def _all_met(self) -> bool:
        """Whether every node knows every other; a node that does not yet is sent MEET
        again (a MEET can get lost while a loaded machine starts six servers)."""
        lagging = [n for n in self.all_nodes if self._known(n) < len(self.all_nodes)]
        for n in lagging:
            for other in self.all_nodes:
                if other is not n:
                    self._cmd(n, "CLUSTER", "MEET", "127.0.0.1", other.port)
        if lagging:
            time.sleep(0.2)
        return not lagging

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
    from ..client_info import server_versions, version_tuple

    return version_tuple(server_versions(client)[0]) >= (7, 0)


