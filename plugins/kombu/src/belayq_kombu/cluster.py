"""``belayq+cluster://``: the channel on a Redis Cluster.

Every command and script the channel sends touches one slot:

* a kombu queue's lists are named inside a hash tag (``{celery}``, ``{celery}\\x06\\x163``
  ..., :func:`belayq.keys.kombu_cluster_name`), so its priority levels and the core's keys
  (all named ``{celery}:...``) share one slot; the core's scripts run there;
* the binding table of an exchange (``_kombu.binding.<exchange>``) is one set, written with
  single-key commands; kombu >= 5.4's binding expiry (a script over the table and a
  fleet-wide deadline set, two slots) is left out: the table members of an expiring queue
  stay until the queue is deleted, as with kombu < 5.4;
* the blocking claim of a queue waits on a connection to the primary that serves the
  queue's slot (a pool per node, hooked into the poller like the single-node ones); a claim
  answered with a redirection follows the slot to its new node;
* fanout (Celery's remote control, ``celery inspect``, events) subscribes on one node:
  a PUBLISH on any node of a cluster reaches the subscribers of every node.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import redis
from redis.cluster import RedisCluster

from belayq.keys import kombu_cluster_name

from . import topology
from .channel import Channel
from .topology import Topology

if TYPE_CHECKING:
    from belayq import ReliableQueue


class _ChainingPipeline:
    """kombu chains pipeline calls (``pipe = pipe.llen(key)``); some commands of redis-py's
    cluster pipeline return None. Every command here returns the pipeline."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pipe, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> _ChainingPipeline:
            attr(*args, **kwargs)
            return self

        return call

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self._pipe.execute(*args, **kwargs)

    def __enter__(self) -> _ChainingPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pipe.reset()


class KombuCluster(RedisCluster):
    """The cluster client kombu's inherited code runs on: non-transactional pipelines (a
    queue's lists share a slot, but a binding table and its queue do not)."""

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction=None, shard_hint=shard_hint)  # type: ignore[no-untyped-call]
        return _ChainingPipeline(pipe)


class ClusterChannel(Channel):
    """A belayq channel whose Redis is a cluster."""

    follows_slots = True
    refuses_replicas = False  # the cluster client routes to primaries
    topology: Topology

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self.topology = connection.topology
        self._cluster: RedisCluster | None = None
        self._node_pools: dict[tuple[str, int], redis.ConnectionPool] = {}
        super().__init__(connection, *args, **kwargs)
        if self.global_keyprefix:
            raise ValueError(
                "belayq+cluster:// does not support the transport option 'global_keyprefix' "
                "(its prefixed commands are single-node); give the queues distinct names")

    # -- clients -------------------------------------------------------------------------

    def _cluster_params(self, asynchronous: bool) -> dict[str, Any]:
        params = topology.server_params(self._connparams(asynchronous=asynchronous),
                                        self.topology)
        params.pop("max_connections", None)
        if params.get("retry_on_timeout") is None:  # redis-py 6+ warns that it is deprecated
            params.pop("retry_on_timeout", None)
        return params

    def new_cluster(self, *, asynchronous: bool = False,
                    cls: type[RedisCluster] = RedisCluster) -> RedisCluster:
        """A cluster client from the URL's startup nodes.

        Raises:
            redis.ConnectionError: No startup node answered (kombu retries it).
            ValueError: A node answered that is not in cluster mode.
        """
        params = self._cluster_params(asynchronous)
        # Its nodes' clients take no connection class, only ssl=True and the ssl_* options.
        params.pop("connection_class", None)
        if self.connection.client.ssl:
            params["ssl"] = True
        try:
            return cls(startup_nodes=topology.startup_nodes(self.topology.nodes), **params)
        except redis.exceptions.RedisClusterException as exc:
            if "not enabled" in str(exc).lower():
                raise ValueError(
                    f"belayq+cluster://{self.topology.describe()}: the server is not in "
                    "cluster mode (cluster-enabled no); use belayq://") from exc
            raise redis.ConnectionError(
                f"no node of the Redis Cluster at {self.topology.describe()} answered: "
                f"{exc}") from exc

    @property
    def cluster(self) -> RedisCluster:
        if self._cluster is None:
            self._cluster = self.new_cluster(cls=KombuCluster)
        return self._cluster

    def _create_client(self, asynchronous: bool = False) -> Any:
        return self.cluster

    def _get_pool(self, asynchronous: bool = False) -> Any:
        # The stock pools would connect to the URL's host as one server (or to
        # localhost:6379): nothing on a cluster may use them.
        raise AssertionError("belayq+cluster:// has no single-server pool")

    def new_core_client(self) -> Any:
        return self.new_cluster()

    def node_pool(self, host: str, port: int) -> redis.ConnectionPool:
        """The pool of claim (and pub/sub) connections to node ``host:port``, whose
        connections tell the poller when they close."""
        pool = self._node_pools.get((host, port))
        if pool is None:
            params = self._cluster_params(asynchronous=True)
            pool = redis.ConnectionPool(host=host, port=port, **params)
            self._node_pools[(host, port)] = pool
        return pool

    def claim_pool(self, rq: ReliableQueue) -> Any:
        node = rq.client.get_node_from_key(rq.keys.ready)
        return self.node_pool(node.host, node.port)

    def claim_unblock(self) -> Any:
        return None  # CLIENT UNBLOCK must reach the claim's own node: the claim knows it

    @property
    def subclient(self) -> Any:
        client = self.__dict__.get("subclient")
        if client is None:
            nodes = self.cluster.get_primaries()  # type: ignore[no-untyped-call]
            node = random.choice(nodes)
            pool = self.node_pool(node.host, node.port)
            client = redis.Redis(connection_pool=pool).pubsub()  # type: ignore[no-untyped-call]
            self.__dict__["subclient"] = client
        return client

    def _disconnect_pools(self) -> None:
        pools, self._node_pools = self._node_pools, {}
        for pool in pools.values():
            pool.disconnect()
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.close()

    # -- keys and bindings ---------------------------------------------------------------

    def _q_for_pri(self, queue: str, pri: int) -> str:
        return str(super()._q_for_pri(kombu_cluster_name(queue), pri))

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        if self.typeof(exchange).type == "fanout":
            self._fanout_queues[queue] = (exchange, routing_key.replace("#", "*"))
        member = self.sep.join([routing_key or "", pattern or "", queue or ""])
        self.cluster.sadd(self.keyprefix_queue % (exchange,), member)

    def maybe_refresh_binding_expiry(self) -> None:
        """kombu >= 5.4's binding expiry spans two slots: left out on a cluster."""

    def sweep_bindings(self, limit: int = 100) -> int:
        return 0

    def adopt_stock(self) -> None:
        """The stock transport never ran on a cluster: no stock unacked hash to adopt."""
