"""The servers of a run: the broker and the ledger (one redis-server, never faulted). The
broker is one of three topologies (``--broker``): ``single`` (one redis-server, AOF with
``appendfsync always``, restartable on the same port and directory), ``sentinel`` (a
primary, two replicas, three sentinels) or ``cluster`` (3 masters + 3 replicas). All on
free ports, never 6379, and all removed at the end."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from belayq.embedded import (
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    redis_server_binary,
    system_redis_server,
)


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


# -- broker topologies ---------------------------------------------------------------------

BROKERS = ("single", "sentinel", "cluster")
SERVICE_NAME = "chaos"
#: ``down-after-milliseconds`` of the sentinels: 2 s rather than the fixture's 1 s, so a
#: primary that is merely slow on the shared 2-CPU machine is less often failed over.
SENTINEL_DOWN_AFTER_MS = 2000
#: ``12345:X 03 Dec 2026 04:27:55.804 # +switch-master chaos 127.0.0.1 1 127.0.0.1 2``
_SENTINEL_LINE = re.compile(
    r"^\d+:X (?P<when>\d+ \w+ \d+ [\d:.]+) [#*] (?P<event>\S+) (?P<args>.*)$"
)


@dataclass(frozen=True)
class BrokerSpec:
    """How the stacks reach the broker: one server (``port``), a Sentinel group
    (``sentinels``, ``service_name``) or a Redis Cluster (``cluster_nodes``)."""

    kind: str
    port: int = 0
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str = SERVICE_NAME
    cluster_nodes: tuple[tuple[str, int], ...] = ()

    def client(self, name: str, **kwargs: Any) -> Any:
        """A client of the broker for the harness (``name``: its CLIENT SETNAME, so
        ``client-kill`` spares it): plain, Sentinel-managed or a ``RedisCluster``."""
        if self.kind == "sentinel":
            sentinel = Sentinel(list(self.sentinels), socket_timeout=2)  # type: ignore[no-untyped-call]
            return sentinel.master_for(self.service_name, client_name=name, **kwargs)  # type: ignore[no-untyped-call]
        if self.kind == "cluster":
            from redis.cluster import ClusterNode, RedisCluster

            nodes = [ClusterNode(h, p) for h, p in self.cluster_nodes]  # type: ignore[no-untyped-call]
            return RedisCluster(startup_nodes=nodes, client_name=name, **kwargs)
        return redis.Redis(port=self.port, client_name=name, **kwargs)


class Broker:
    """One topology's servers: started, faulted and stopped by the run."""

    kind = ""

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        raise NotImplementedError

    def spec(self) -> BrokerSpec:
        raise NotImplementedError

    def data_ports(self) -> list[int]:
        """The live data servers (``client-kill`` cuts the workers' connections on each)."""
        raise NotImplementedError

    def restart(self, how: str) -> dict[str, object]:
        raise ValueError(f"redis-restart is not a fault of the {self.kind} broker")

    def failover(self, queue: str) -> dict[str, object]:
        raise ValueError(
            f"failover needs replicas: run it with --broker sentinel or --broker cluster, "
            f"not --broker {self.kind}"
        )

    def log_tail(self) -> str:
        return ""

    def save_logs(self, logdir: Path) -> None:
        """Copy the topology's own logs into ``logdir`` (before :meth:`stop` removes them)."""

    def switches(self) -> list[dict[str, Any]]:
        """Changes of primary the servers logged (Sentinel only; empty elsewhere)."""
        return []


class SingleBroker(Broker):
    """One :class:`BrokerServer` (AOF, restartable): what the harness always ran."""

    kind = "single"

    def __init__(self) -> None:
        self.server = BrokerServer()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def spec(self) -> BrokerSpec:
        return BrokerSpec("single", port=self.server.port)

    def data_ports(self) -> list[int]:
        return [self.server.port]

    def restart(self, how: str) -> dict[str, object]:
        return self.server.restart(how)

    def log_tail(self) -> str:
        return (self.server.dir / "redis.log").read_text(errors="replace")[-4000:]


class SentinelBroker(Broker):
    """A primary, two replicas and three sentinels (:class:`RedisSentinelServers`;
    ``down-after-milliseconds`` 2000, ``failover-timeout`` 3000; no persistence: a killed
    server comes back empty, as a replica of whoever is primary then)."""

    kind = "sentinel"

    def __init__(self) -> None:
        self.group = RedisSentinelServers(
            binary(), service_name=SERVICE_NAME, down_after_ms=SENTINEL_DOWN_AFTER_MS
        )
        self.group.start(timeout=60)
        self.failovers = 0

    def stop(self) -> None:
        self.group.stop()

    def save_logs(self, logdir: Path) -> None:
        for i, s in enumerate(self.group.sentinels):
            (logdir / f"sentinel-{i}.log").write_text(s.log())

    def switches(self) -> list[dict[str, Any]]:
        """Every change of primary the sentinels logged (``+switch-master``), the planned
        ones and any other (a primary that answered no sentinel for ``down-after`` ms on a
        busy machine is failed over although it runs): when (``t``), from and to which
        port, when the sentinels first found the old one down (``sdown_t``) and when they
        turned it into a replica (``demoted_t``; None: it was dead, or never came back)."""
        events: list[tuple[float, str, list[str]]] = []
        for s in self.group.sentinels:
            for line in s.log().splitlines():
                m = _SENTINEL_LINE.match(line)
                if m:
                    t = datetime.strptime(m["when"], "%d %b %Y %H:%M:%S.%f").timestamp()
                    events.append((t, m["event"], m["args"].split()))
        events.sort()
        out: list[dict[str, Any]] = []
        for t, event, args in events:
            if event != "+switch-master" or len(args) < 5:
                continue
            old, new = int(args[2]), int(args[4])
            if any(x["old"] == old and x["new"] == new and abs(x["t"] - t) < 5 for x in out):
                continue  # the same switch, as another sentinel logged it
            sdown = [u for u, e, a in events if e == "+sdown" and a[:1] == ["master"]
                     and a[-1:] == [str(old)] and t - 30 < u <= t]  # fmt: skip
            demoted = [u for u, e, a in events if e == "+convert-to-slave"
                       and a[1:2] == [f"127.0.0.1:{old}"] and u >= t]  # fmt: skip
            out.append({"t": t, "old": old, "new": new,
                        "sdown_t": sdown[0] if sdown else None,
                        "demoted_t": demoted[0] if demoted else None})  # fmt: skip
        return out

    def spec(self) -> BrokerSpec:
        return BrokerSpec(
            "sentinel", sentinels=tuple(self.group.sentinel_addresses),
            service_name=self.group.service_name,
        )  # fmt: skip

    def data_ports(self) -> list[int]:
        return [s.port for s in self.group.servers if s.proc is not None and s.proc.poll() is None]

    def failover(self, queue: str) -> dict[str, object]:
        """SIGKILL the primary, wait until every sentinel names a promoted replica, then start
        the killed server again as a replica of the new primary and wait until the new
        primary has both replicas online (so the next failover has two to choose from)."""
        g = self.group
        old = g.master_address()
        server = g.server_at(old[1])
        assert server.proc is not None
        old_pid = server.proc.pid
        lag = _replica_lag(old[1])
        t0 = time.time()
        g.kill_primary()
        detail: dict[str, object] = {
            "old_primary": old[1], "old_pid": old_pid, "lag_bytes_before": lag,
        }  # fmt: skip
        try:
            new = g.wait_for_new_primary(old, timeout=60)
        except AssertionError as exc:
            detail.update(verified=False, error=str(exc)[-2000:])
            return detail
        promoted = time.time()
        args = list(server.args)
        if "--replicaof" in args:
            i = args.index("--replicaof")
            del args[i : i + 3]
        server.args = [*args, "--replicaof", new[0], str(new[1])]
        server.start()
        rejoined = _poll_until(lambda: _online_replicas(new[1]) >= 2, 60)
        self.failovers += 1
        detail.update(
            new_primary=new[1],
            no_primary_s=round(promoted - t0, 3),
            rejoin_s=round(time.time() - promoted, 3),
            rejoined=rejoined,
            verified=new != old and _role(new[1]) == "master",
        )
        return detail

    def log_tail(self) -> str:
        return "\n".join(s.log()[-1500:] for s in self.group.sentinels)


class ClusterBroker(Broker):
    """A 3-master, 3-replica Redis Cluster (:class:`RedisClusterServers`, node timeout
    1500 ms). A killed master comes back empty (no persistence) and rejoins as a replica
    of its promoted one (its ``nodes.conf`` stays in its directory)."""

    kind = "cluster"

    def __init__(self) -> None:
        self.cluster = RedisClusterServers(binary(), replicas=1)
        self.cluster.start()
        self.failovers = 0

    def stop(self) -> None:
        self.cluster.stop()

    def spec(self) -> BrokerSpec:
        return BrokerSpec("cluster", cluster_nodes=tuple(self.cluster.startup_nodes))

    def data_ports(self) -> list[int]:
        return [n.port for n in self.cluster.live()]

    def failover(self, queue: str) -> dict[str, object]:
        """SIGKILL the master of the queue's slot (belayq's keys share the hash tag
        ``{queue}``), wait for its replica's promotion, start the killed node again and
        wait until it is a replica."""
        c = self.cluster
        master = c.master_of_key("{" + queue + "}")
        replica = c.replica_of(master)
        assert master.proc is not None
        detail: dict[str, object] = {"old_primary": master.port, "old_pid": master.proc.pid,
                                     "lag_bytes_before": _replica_lag(master.port)}  # fmt: skip
        t0 = time.time()
        c.kill(master)
        try:
            c.wait_promoted(replica, timeout_s=60)
        except RuntimeError as exc:
            detail.update(verified=False, error=str(exc))
            return detail
        promoted = time.time()
        master.start()
        rejoined = _poll_until(
            lambda: (
                _info(master.port, "replication").get("master_link_status") == "up" and c._all_ok()
            ),
            60,
        )
        self.failovers += 1
        detail.update(
            new_primary=replica.port,
            no_primary_s=round(promoted - t0, 3),
            rejoin_s=round(time.time() - promoted, 3),
            rejoined=rejoined,
            verified=c.role(replica) == "master",
        )
        return detail


def make_broker(kind: str) -> Broker:
    if kind == "single":
        return SingleBroker()
    if kind == "sentinel":
        return SentinelBroker()
    if kind == "cluster":
        return ClusterBroker()
    raise ValueError(f"unknown broker {kind!r}; known: {', '.join(BROKERS)}")


def _info(port: int, section: str) -> dict[str, Any]:
    client = redis.Redis(port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0))
    try:
        return dict(client.info(section))
    except redis.RedisError:
        return {}
    finally:
        client.close()


def _role(port: int) -> str:
    return str(_info(port, "replication").get("role", ""))


def _online_replicas(port: int) -> int:
    info = _info(port, "replication")
    return sum(
        1 for k, v in info.items()
        if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
    )  # fmt: skip


def _replica_lag(port: int) -> int:
    """Bytes of the primary's replication stream its most up-to-date replica had not
    acknowledged just before the kill (as of its last REPLCONF ACK, once a second)."""
    info = _info(port, "replication")
    offsets = [
        int(v.get("offset", 0)) for k, v in info.items()
        if k.startswith("slave") and isinstance(v, dict)
    ]  # fmt: skip
    return int(info.get("master_repl_offset", 0)) - max(offsets, default=0)


def _poll_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except (OSError, redis.RedisError):
            pass
        time.sleep(0.05)
    return False
