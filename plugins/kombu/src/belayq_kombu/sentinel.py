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

from typing import Any

import redis
from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection

from .channel import Channel
from .topology import Topology, server_params


class SentinelChannel(Channel):
    """A belayq channel on the primary Redis Sentinel names."""

    connection_class = SentinelManagedConnection
    connection_class_ssl = SentinelManagedSSLConnection
    from_transport_options = (*Channel.from_transport_options, "master_name",
                              "min_other_sentinels", "sentinel_kwargs")
    master_name: str | None = None
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
        master = self._sentinel(params).master_for(  # type: ignore[no-untyped-call]
            self.master_name, redis.Redis)
        return master.connection_pool

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
