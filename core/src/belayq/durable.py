"""Durable writes: a script's call followed, in the same round trip, by WAIT (its
replicas) or WAITAOF (its disks and its replicas'), and the one clear error when fewer
confirmed than ``wait_replicas`` asks (mixed into :class:`~belayq.scripts.ScriptRunner`)."""

from __future__ import annotations

from typing import Any

from . import client_info
from .config import QueueConfig
from .constants import AOF_ACK_PROBE_MS
from .errors import CLIENT_ERROR, ConfigError, DurabilityError, Errors

Arg = str | bytes | int | float

#: What reading the primary's replication state may raise (the hint is left out then).
_HINT_FAILED: Errors = (*CLIENT_ERROR, ValueError, TypeError)


class DurableWrites:
    """The waits of a script runner whose queue sets ``wait_replicas`` or ``wait_aof``."""

    client: Any
    config: QueueConfig
    #: What a durable call sends after its script (None: calls do not wait).
    wait_command: tuple[Arg, ...] | None
    #: A WAIT for the replicas' memory sent before the WAITAOF (see wait_for_replicas).
    _ack_probe: tuple[Arg, ...] | None

    def _node_client(self) -> Any:
        """The client of the server that holds the queue's keys."""
        raise NotImplementedError

    def _send_durable(self, command: list[Arg]) -> tuple[Any, Any]:
        assert self.wait_command is not None
        pipe = self._node_client().pipeline(transaction=False)
        pipe.execute_command(*command)
        if self._ack_probe is not None:
            pipe.execute_command(*self._ack_probe)
        pipe.execute_command(*self.wait_command)
        replies = pipe.execute(raise_on_error=False)
        return replies[0], replies[-1]

    def wait_for_replicas(self, versions: list[str]) -> None:
        """Make durable calls wait: for ``wait_replicas`` replicas and the primary's AOF
        fsync (WAITAOF) when ``wait_aof`` asks or, unset, when every server runs 7.2+ with
        appendonly on and ``appendfsync always`` (with ``everysec`` a replica confirms its
        fsync about once a second: each call would wait that long); else for the replicas
        alone (WAIT).

        Raises:
            ConfigError: ``wait_aof=True`` on a server without WAITAOF (Redis before 7.2,
                fakeredis) or without appendonly: no write could ever be confirmed.
        """
        c = self.config
        has_waitaof = bool(versions) and all(
            client_info.version_tuple(v) >= (7, 2) for v in versions
        )
        aof = c.wait_aof
        if aof is None:
            aof = (
                has_waitaof
                and client_info.aof_enabled(self.client)
                and client_info.aof_fsync_always(self.client)
            )
        elif aof and not has_waitaof:
            raise ConfigError(
                "wait_aof=True needs the WAITAOF command (Redis 7.2+ or Valkey); the server "
                f"runs {', '.join(versions) if versions else 'a version that does not say'}. "
                "Upgrade it, or leave wait_aof unset: wait_replicas then waits for the "
                "replicas' memory (WAIT), not for any disk"
            )
        elif aof and not client_info.aof_enabled(self.client):
            raise ConfigError(
                "wait_aof=True needs appendonly yes on the server (WAITAOF confirms fsyncs "
                "of the append-only file, which it does not write now): turn it on "
                "(appendonly yes in its configuration, or CONFIG SET appendonly yes), or "
                "leave wait_aof unset"
            )
        if aof:
            self.wait_command = ("WAITAOF", 1, c.wait_replicas, c.wait_timeout_ms)
            if c.wait_replicas:
                probe_ms = min(c.wait_timeout_ms, AOF_ACK_PROBE_MS)
                self._ack_probe = ("WAIT", c.wait_replicas, probe_ms)
        else:
            self.wait_command = ("WAIT", c.wait_replicas, c.wait_timeout_ms)

    def _check_durable(self, confirmed: Any) -> None:
        wanted = self.config.wait_replicas
        within = f"within {self.config.wait_timeout_ms} ms"
        if isinstance(confirmed, Exception):
            raise DurabilityError(f"could not wait for the write to be confirmed: {confirmed}")
        if isinstance(confirmed, list):  # WAITAOF: [local fsyncs, replica fsyncs]
            local, replicas = int(confirmed[0]), int(confirmed[1])
            if local < 1:
                raise DurabilityError(
                    "the write is in the primary's memory, but its append-only file did not "
                    f"reach the disk {within}: a crash of the primary now could lose it"
                )
            if replicas < wanted:
                hint = self._replicas_hint(wanted) or (
                    " (a replica confirms only with appendonly yes)"
                )
                raise DurabilityError(
                    f"the write is on the primary's disk, but only {replicas} of {wanted} "
                    f"replica(s) confirmed it on theirs {within}: a failover now could lose "
                    f"it{hint}"
                )
            return
        if int(confirmed) < wanted:
            raise DurabilityError(
                f"the write is on the primary, but only {int(confirmed)} of {wanted} "
                f"replica(s) confirmed it {within}: a failover now could lose "
                f"it{self._replicas_hint(wanted)}"
            )

    def _replicas_hint(self, wanted: int) -> str:
        """Why the replicas did not confirm, when the primary says it has too few (a
        replica promoted by a failover has none until one rejoins); "" if it cannot say."""
        try:
            info = self._node_client().info("replication")
            connected = int(info.get("connected_slaves", -1))
        except _HINT_FAILED:
            return ""
        if 0 <= connected < wanted:
            return (
                f" (the primary has {connected} replica(s) connected: after a failover, "
                "until a replica rejoins it, every durable write raises this; the writes "
                "are applied all the same)"
            )
        return ""
