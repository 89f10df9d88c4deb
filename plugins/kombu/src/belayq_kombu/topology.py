"""Where the broker is, read from the URL: one server (``belayq://``), a Redis Cluster
(``belayq+cluster://``) or the primary Redis Sentinel names (``belayq+sentinel://``).

kombu splits ``a+b://...`` into transport ``a`` and hostname ``b://...`` (SQLAlchemy style),
so every form selects the ``belayq`` (or ``belayqs``) transport, and the part after the ``+``
says how to reach Redis. Several nodes follow kombu's ``sentinel://`` convention, one URL
each, separated by ``;``::

    belayq+cluster://h1:7000;belayq+cluster://h2:7001
    belayq+sentinel://:pw@s1:26379/0;belayq+sentinel://s2:26379

TLS: ``belayq+clusters://``, ``belayq+sentinels://`` (or the ``belayqs+`` transport, or
``broker_use_ssl``), as ``rediss://`` is to ``redis://``.

Also here: the connection classes that turn a demoted primary's ``READONLY`` reply into a
connection error (kombu then reconnects, and a reconnect reaches the new primary) instead
of an error Celery treats as fatal (celery#7946).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis import exceptions as _errors

SINGLE = "single"
CLUSTER = "cluster"
SENTINEL = "sentinel"

#: The scheme after ``belayq+`` -> (kind, TLS).
INNER_SCHEMES: dict[str, tuple[str, bool]] = {
    "cluster": (CLUSTER, False),
    "clusters": (CLUSTER, True),
    "sentinel": (SENTINEL, False),
    "sentinels": (SENTINEL, True),
}

DEFAULT_PORT = {CLUSTER: 6379, SENTINEL: 26379}

FORMS = ("belayq://host:6379/0, belayq+cluster://h1:7000;belayq+cluster://h2:7001, "
         "belayq+sentinel://s1:26379;belayq+sentinel://s2:26379 (TLS: belayqs://, "
         "belayq+clusters://, belayq+sentinels://)")


@dataclasses.dataclass(frozen=True)
class Topology:
    """How to reach Redis: ``kind`` (single, cluster, sentinel), the nodes the URL names
    (cluster startup nodes, or sentinels), the credentials and database of the Redis
    servers (not of the sentinels: ``sentinel_kwargs`` has those), and TLS."""

    kind: str = SINGLE
    nodes: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: bool = False

    def describe(self) -> str:
        return ";".join(f"{h}:{p}" for h, p in self.nodes)


def of_connection(conninfo: Any) -> Topology:
    """The topology of kombu connection ``conninfo`` (its hostname and failover alternates).

    Raises:
        ValueError: An unknown form after ``+``, forms mixed in one URL, a missing host, a
            bad port or database, a cluster database other than 0.
    """
    hostname = conninfo.hostname or ""
    # With several URLs, kombu's failover switch() re-parses the next one without its
    # ``+`` split (transport ``belayq+cluster``, hostname ``h2``): read the URL list then.
    urls = [u for u in (conninfo.alt or []) if isinstance(u, str) and _has_inner(u)]
    if not urls:
        if "://" not in hostname:
            return Topology()
        urls = [hostname]
    parsed = [_parse(u) for u in urls]
    kinds = {(p.kind, p.tls) for p in parsed}
    if len(kinds) > 1:
        raise ValueError(f"a broker URL with several hosts must use one form for all of them, "
                         f"got {';'.join(urls)!r}")
    first = parsed[0]
    nodes = tuple(n for p in parsed for n in p.nodes)
    if first.kind == CLUSTER and first.db != 0:
        raise ValueError(f"a Redis Cluster has database 0 only; remove /{first.db} from the "
                         f"broker URL {urls[0]!r}")
    return dataclasses.replace(first, nodes=nodes)


def parse_url(url: str) -> Topology:
    """The topology of one ``belayq+cluster://`` or ``belayq+sentinel://`` URL.

    Raises:
        ValueError: As :func:`of_connection`.
    """
    return _parse(url)


def _has_inner(url: str) -> bool:
    scheme, sep, _ = url.partition("://")
    return bool(sep) and "+" in scheme


def _parse(url: str) -> Topology:
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a broker URL: {url!r}; use one of {FORMS}")
    inner = scheme.rpartition("+")[2].lower()
    if inner not in INNER_SCHEMES:
        raise ValueError(f"belayq+{inner}:// is not a belayq URL form; use one of {FORMS}")
    kind, tls = INNER_SCHEMES[inner]
    parts = urlsplit(f"{inner}://{rest}")
    if not parts.hostname:
        raise ValueError(f"the broker URL {url!r} names no host")
    try:
        port = parts.port or DEFAULT_PORT[kind]
    except ValueError as exc:
        raise ValueError(f"the broker URL {url!r} has a bad port: {exc}") from None
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"the broker URL {url!r}: the database must be a number, got {path!r}")
    return Topology(
        kind=kind, nodes=((parts.hostname, port),),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        db=int(path or 0), tls=tls,
    )


def server_params(params: dict[str, Any], topology: Topology) -> dict[str, Any]:
    """The connection parameters of the Redis servers: kombu's (``params``, from the
    channel's transport options) without its host/port/db, with the URL's credentials."""
    out = {k: v for k, v in params.items() if k not in ("host", "port", "db", "virtual_host")}
    out["username"] = topology.username
    out["password"] = topology.password
    return out


#: Replies of a demoted primary (or a primary that lost its replicas' link) that mean "ask
#: another server": a reconnect reaches the new primary, a retry here never would.
DEMOTED = (_errors.ReadOnlyError, _errors.MasterDownError)


class _FollowsFailover:
    """Turns :data:`DEMOTED` replies into a connection error, closing the socket first."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except DEMOTED as exc:
            self.disconnect()  # type: ignore[attr-defined]
            where = f"{getattr(self, 'host', '?')}:{getattr(self, 'port', '?')}"
            raise redis.ConnectionError(
                f"{where} answered {exc!s:.80} (a failover demoted it): reconnecting") from exc


class FailoverConnection(_FollowsFailover, redis.Connection):
    """A TCP connection that reconnects when its server was demoted."""


class FailoverSSLConnection(_FollowsFailover, redis.SSLConnection):
    """A TLS connection that reconnects when its server was demoted."""


def refuse_a_replica(client: Any, where: str) -> None:
    """Raise a connection error when ``client``'s server serves a replica (its primary was
    demoted: a DNS failover not done yet). Celery retries that with its backoff, instead of
    opening a channel whose first write reconnects at once, over and over. A cluster node
    behind a ``belayq://`` URL is refused too (its keys would answer MOVED).

    Raises:
        redis.ConnectionError: The server is a replica.
        ValueError: The server is a Redis Cluster node.
    """
    # INFO, not ROLE: the documented ACL users (docs/acl.md) may run INFO, not ROLE.
    try:
        replication = client.info("replication")
        cluster = client.info("cluster")
    except redis.ResponseError:  # INFO not allowed for this user: the writes will tell
        return
    if str(cluster.get("cluster_enabled", "0")) == "1":
        raise ValueError(f"{where} is a Redis Cluster node: use a belayq+cluster://{where} URL "
                         "(one per node, ';' between them)")
    role = replication.get("role", "master")
    kind = role.decode() if isinstance(role, bytes) else str(role)
    if kind in ("slave", "replica"):
        raise redis.ConnectionError(
            f"{where} serves a replica now (a failover demoted it?); waiting for it to serve "
            "a primary")


def cluster_errors() -> tuple[type[BaseException], ...]:
    """The cluster's errors that mean "try again once the cluster has settled" (a failover
    under way), which kombu must treat as connection errors, not as fatal ones."""
    return (_errors.ClusterDownError, _errors.ClusterError, _errors.TryAgainError,
            _errors.SlotNotCoveredError)


def startup_nodes(nodes: Sequence[tuple[str, int]]) -> list[Any]:
    from redis.cluster import ClusterNode

    return [ClusterNode(host, port) for host, port in nodes]  # type: ignore[no-untyped-call]
