"""``belayq+sentinel://``: the channel whose Redis is the primary that Redis Sentinel names.

As kombu's ``sentinel://``: the URL lists the sentinels (``;`` between them), the transport
options name the primary (``master_name``, required) and configure the sentinel connections
(``sentinel_kwargs``, e.g. their password) and quorum check (``min_other_sentinels``). The
URL's credentials and database are the Redis servers'.

Every connection (the channel's, the blocking claims', the core's) asks the sentinels for the
primary when it connects, and a demoted primary's ``READONLY`` reply closes it (redis-py's
``SentinelManagedConnection``): after a failover the next reconnect reaches the new primary,
with no restart.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import redis
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from .channel import Channel
from .topology import Topology, server_params

#: How long a new channel waits for the sentinels to name a primary that accepts
#: connections (s): a reconnect during a failover then lands as soon as one is elected,
#: not at Celery's next retry (2 s, then 4 s ... later).
PRIMARY_WAIT_S = 10.0


class SentinelChannel(Channel):
    """A belayq channel on the primary Redis Sentinel names."""

    connection_class = SentinelManagedConnection
    connection_class_ssl = SentinelManagedSSLConnection
    from_transport_options = (*Channel.from_transport_options, "master_name",
                              "min_other_sentinels", "sentinel_kwargs")
    master_name: str | None = None
    refuses_replicas = False  # the connections ask the sentinels for the primary
    min_other_sentinels = 0
    sentinel_kwargs: dict[str, Any] | None = None
    topology: Topology

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self.topology = connection.topology
        self._sentinels: list[Sentinel] = []
        super().__init__(connection, *args, **kwargs)

    def _server_params(self, asynchronous: bool) -> dict[str, Any]:
        params = server_params(self._connparams(asynchronous=asynchronous), self.topology)
        params["db"] = self.topology.db
        return params

    def _sentinel(self, params: dict[str, Any]) -> Sentinel:
        if not self.master_name:
            raise ValueError("belayq+sentinel:// needs the transport option 'master_name' "
                             "(the name the sentinels know the primary by)")
        sentinel = Sentinel(list(self.topology.nodes),  # type: ignore[no-untyped-call]
                            min_other_sentinels=int(self.min_other_sentinels or 0),
                            sentinel_kwargs=self.sentinel_kwargs, **params)
        self._sentinels.append(sentinel)
        return sentinel

    def _get_pool(self, asynchronous: bool = False) -> Any:
        params = self._server_params(asynchronous)
        prefix: str = getattr(self, "keyprefix_fanout")  # noqa: B009 (typed by kombu as Any)
        self.keyprefix_fanout = prefix.format(db=params["db"])
        sentinel = self._sentinel(params)
        if asynchronous:  # the channel's first connection (its ping) comes from this pool
            self._await_primary(sentinel)
        master = sentinel.master_for(self.master_name, redis.Redis)  # type: ignore[no-untyped-call]
        return master.connection_pool

    def _await_primary(self, sentinel: Sentinel) -> None:
        """Poll the sentinels (for up to :data:`PRIMARY_WAIT_S`) until the primary they name
        accepts connections; return at once when no sentinel answers at all. What still
        fails afterwards fails in the channel's own connect, with its own error."""
        deadline = time.monotonic() + PRIMARY_WAIT_S
        while time.monotonic() < deadline:
            try:
                address = sentinel.discover_master(self.master_name)  # type: ignore[no-untyped-call]
                with socket.create_connection(address, timeout=0.5):
                    return
            except MasterNotFoundError:
                if not _answers(sentinel):
                    return
            except OSError:
                pass  # the named primary is gone: the sentinels have not noticed yet
            time.sleep(0.1)

    def new_core_client(self) -> Any:
        params = self._server_params(asynchronous=False)
        params.pop("max_connections", None)  # as the core's own pool: grows as needed
        return self._sentinel(params).master_for(  # type: ignore[no-untyped-call]
            self.master_name, redis.Redis)

    def _disconnect_pools(self) -> None:
        super()._disconnect_pools()
        sentinels, self._sentinels = self._sentinels, []
        for sentinel in sentinels:
            for client in sentinel.sentinels:
                client.close()


def _answers(sentinel: Sentinel) -> bool:
    """Whether any of the sentinels answers a PING."""
    for client in sentinel.sentinels:
        try:
            if client.ping():
                return True
        except redis.RedisError:
            continue
    return False
