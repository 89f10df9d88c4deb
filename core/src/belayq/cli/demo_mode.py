"""The demo's queue: a visibility timeout, 3 attempts, the last 50 completed and failed
kept, and events on."""

from __future__ import annotations

from typing import Any

import redis

#: A job fails for good on its third failed run; 50 of each outcome kept.
DEMO_MAX_DELIVERIES = 3
DEMO_HISTORY = 50


def demo_options(visibility_ms: int) -> dict[str, Any]:
    return {"lease_ms": visibility_ms, "max_deliveries": DEMO_MAX_DELIVERIES,
            "history_max": DEMO_HISTORY, "events": True}


def demo_pool(client: redis.Redis, name: str, visibility_ms: int) -> Any:
    from ..web.demo import DemoPool

    return DemoPool(client, name, demo_options(visibility_ms))
