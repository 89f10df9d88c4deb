"""Whether the server may evict queue data, as every tool says it (the command's line, the
dashboard's banner, the exporter's ``belayq_eviction_possible`` gauge).

Under ``maxmemory-policy allkeys-*`` a full server deletes any key: waiting, claimed and dead
messages, a queue's counters, the registry that lists the queues. Under ``volatile-*`` it
deletes keys that have a TTL: belayq's history, and what a framework keeps with one (RQ's
finished jobs and results, a job enqueued with ``ttl=``, Celery's results); the queues' own
keys have none. Only ``noeviction`` keeps them all (a full server then refuses writes
instead).

A server with no memory limit (``maxmemory`` 0, Redis's default) never evicts, whatever its
policy, so it is not warned about.

The policy and the limit are read at each request of a tool (one command), never kept:
``CONFIG GET maxmemory*``, or, where CONFIG is refused (an ACL, a managed service), ``INFO
memory``'s ``maxmemory_policy`` and ``maxmemory``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .client_info import effective_policy, eviction_policies, is_cluster
from .errors import RESPONSE_ERROR
from .site import EVICTION_PAGE, docs_url

log = logging.getLogger("belayq")

@dataclass(frozen=True)
class Eviction:
    """What the server's eviction policy may delete."""

    #: The server's ``maxmemory-policy`` (several, comma-separated, on a cluster).
    policy: str
    #: Whether it may delete keys without a TTL: every queue's messages and the registry.
    any_key: bool

    @property
    def warning(self) -> str:
        """One line for people: what can vanish, what to do, and where it is explained."""
        if self.any_key:
            what = ("any key: waiting, claimed and dead messages, their counters and the "
                    "registry of queues can vanish without an error")
        else:
            what = ("keys with a TTL: belayq's history and what a framework keeps with a "
                    "TTL (RQ's finished jobs and results, Celery's results) can vanish without "
                    "an error, before their time")
        return (f"warning: Redis maxmemory-policy is {self.policy}: under memory pressure "
                f"the server deletes {what}. Set maxmemory-policy noeviction, so a full "
                f"server refuses writes instead; see {docs_url()}{EVICTION_PAGE}")


def policies(client: Any) -> list[str]:
    """The ``maxmemory-policy`` of the server (of each primary of a cluster): by ``CONFIG
    GET``, or by ``INFO memory`` where CONFIG is refused; [] when neither answers. A server
    with no memory limit (``maxmemory`` 0) never evicts: it counts as ``noeviction``."""
    if not is_cluster(client):
        try:
            got = client.config_get("maxmemory*")  # one pattern: Redis 6.2 takes no more
        except RESPONSE_ERROR as exc:  # refused by an ACL, renamed away: INFO tells it too
            log.debug("CONFIG GET maxmemory* refused (%s): reading INFO memory", exc)
        else:
            value = got.get("maxmemory-policy") if isinstance(got, dict) else None
            if value:
                return [effective_policy(value, got.get("maxmemory"))]
    return eviction_policies(client)


def of(client: Any) -> Eviction | None:
    """What the server may evict, read now (one command); None under ``noeviction``, with no
    memory limit, or when the server will not tell its policy."""
    return judge(policies(client))


def judge(found_policies: list[str]) -> Eviction | None:
    """What servers under ``found_policies`` may evict; None when none may."""
    found = sorted({p for p in found_policies if p != "noeviction"})
    if not found:
        return None
    return Eviction(policy=", ".join(found), any_key=any(p.startswith("allkeys-")
                                                         for p in found))


def warning(client: Any) -> str | None:
    """The line every tool shows when the server may evict queue data, else None."""
    found = of(client)
    return found.warning if found is not None else None
