"""Facts about a redis-py (or fakeredis, or cluster) client that the core needs."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from .constants import (
    BLOCK_ROUND_MAX_S,
    BLOCK_ROUND_MIN_S,
    BLOCK_SHARE_OF_SOCKET_TIMEOUT,
    REDIS_PY_READ_TIMEOUT_S,
)
from .errors import RESPONSE_ERROR, EvictionRiskWarning
from .site import EVICTION_PAGE, docs_url

log = logging.getLogger("belayq")

#: Policies that may evict a key without a TTL: every belayq queue key.
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster."""
    return hasattr(client, "nodes_manager")


def connection_kwargs(client: Any) -> dict[str, Any]:
    """The keyword arguments the client opens connections with."""
    if is_cluster(client):
        return dict(getattr(client.nodes_manager, "connection_kwargs", {}) or {})
    pool = getattr(client, "connection_pool", None)
    return dict(getattr(pool, "connection_kwargs", {}) or {})


def blocking_cap_s(kwargs: dict[str, Any]) -> float:
    """Longest single BLMOVE wait that stays inside the client's socket timeout (s)."""
    # A pool built by from_url() or by hand may not name socket_timeout, yet redis-py 8's
    # connections then read with a 5 s timeout: assume that, never wait that long in one go.
    timeout = kwargs.get("socket_timeout") or REDIS_PY_READ_TIMEOUT_S
    return max(
        BLOCK_ROUND_MIN_S, min(BLOCK_ROUND_MAX_S, float(timeout) * BLOCK_SHARE_OF_SOCKET_TIMEOUT)
    )


def _info(client: Any, section: str) -> Any:
    """``INFO section``; of every primary of a cluster (redis-py asks one node otherwise)."""
    if is_cluster(client):
        return client.info(section, target_nodes=client.PRIMARIES)
    return client.info(section)


def server_versions(client: Any) -> list[str]:
    """``redis_version`` of every server the client reaches ([] when it will not say:
    fakeredis has no INFO, and emulates a recent Redis)."""
    try:
        info = _info(client, "server")
    except RESPONSE_ERROR:
        return []
    if "redis_version" in info:
        return [str(info["redis_version"])]
    return [str(v["redis_version"]) for v in info.values() if isinstance(v, dict)]


def version_tuple(version: str) -> tuple[int, ...]:
    """``"6.2.14"`` -> ``(6, 2, 14)``; junk parts count as 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def aof_enabled(client: Any) -> bool:
    """Whether every server the client reaches has appendonly on."""
    try:
        info = _info(client, "persistence")
    except RESPONSE_ERROR:
        return False
    if "aof_enabled" in info:
        return bool(int(info["aof_enabled"]))
    nodes = [v for v in info.values() if isinstance(v, dict)]
    return bool(nodes) and all(int(v.get("aof_enabled", 0)) for v in nodes)


def aof_fsync_always(client: Any) -> bool:
    """Whether every server the client reaches fsyncs its append-only file on every write
    (``appendfsync always``); False when one does not, or will not say (CONFIG refused: a
    managed service, an ACL user without +config)."""
    try:
        if is_cluster(client):
            found = client.config_get("appendfsync", target_nodes=client.PRIMARIES)
            replies = [v for v in found.values() if isinstance(v, dict)]
        else:
            replies = [client.config_get("appendfsync")]
    except RESPONSE_ERROR:
        return False
    policies = [_text(r.get("appendfsync", r.get(b"appendfsync", ""))) for r in replies]
    return bool(policies) and all(p == "always" for p in policies)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def eviction_policies(client: Any) -> list[str]:
    """``maxmemory_policy`` of every server the client reaches, from ``INFO memory`` (which
    managed services allow where they disable CONFIG); [] when the server will not say (an
    ACL user without +info, fakeredis). A server with no memory limit (``maxmemory`` 0)
    never evicts, whatever its policy: it counts as ``noeviction``."""
    try:
        info = _info(client, "memory")
    except RESPONSE_ERROR as exc:  # NoPermissionError included
        log.debug("cannot read the eviction policy (INFO memory): %s", exc)
        return []
    if "maxmemory_policy" in info:
        return [effective_policy(info["maxmemory_policy"], info.get("maxmemory"))]
    return [
        effective_policy(v["maxmemory_policy"], v.get("maxmemory"))
        for v in info.values()
        if isinstance(v, dict) and "maxmemory_policy" in v
    ]


def effective_policy(policy: Any, maxmemory: Any) -> str:
    """The policy a server applies: ``noeviction`` when it has no memory limit (``maxmemory``
    0: it never evicts), else its ``maxmemory-policy``. An unknown limit (None) is taken as
    set, so the policy is never hidden."""
    text = policy.decode() if isinstance(policy, bytes) else str(policy)
    if maxmemory is not None:
        try:
            if int(maxmemory) == 0:
                return "noeviction"
        except ValueError:
            pass
    return text


def warn_if_evicting(client: Any) -> None:
    """Warn (:class:`~belayq.errors.EvictionRiskWarning`) when a server the client reaches
    may evict keys that have no TTL. Called once per client, when its first queue connects.
    """
    risky = sorted({p for p in eviction_policies(client) if p in EVICTING_POLICIES})
    if risky:
        warnings.warn(
            f"Redis maxmemory-policy is {', '.join(risky)}: under memory pressure Redis will "
            "delete keys that have no TTL, and belayq's queue keys (ready, in flight, dead "
            "messages) have none, so messages can vanish without an error. Set "
            "maxmemory-policy to noeviction (on a managed service, in its parameter "
            "group / configuration), so a full server refuses writes "
            f"instead. See {docs_url()}{EVICTION_PAGE}",
            EvictionRiskWarning,
            stacklevel=5,
        )
