"""``rq worker -c benchmarks.chaos.rq_settings``: RQ's Sentinel settings (``SENTINEL``,
read by ``rq.cli.helpers.get_redis_from_config``) from the environment the harness sets:
``CHAOS_SENTINELS`` (``host:port,host:port,...``) and ``CHAOS_MASTER_NAME``."""

from __future__ import annotations

import os

SENTINEL = {
    "INSTANCES": [
        (host, int(port))
        for host, port in (
            item.rsplit(":", 1) for item in os.environ["CHAOS_SENTINELS"].split(",") if item
        )
    ],
    "MASTER_NAME": os.environ["CHAOS_MASTER_NAME"],
    "DB": 0,
    "SENTINEL_KWARGS": {"socket_timeout": 2},
}
