"""belayq: a reliable Redis queue core (BLMOVE claims, fenced leases, Lua settlement, sweep)."""

from .admin import Purged
from .config import QueueConfig
from .errors import (
    BelayqError,
    ConfigError,
    ConnectionLost,
    CrossSlot,
    DurabilityError,
    EvictionRiskWarning,
    NotPermitted,
    OutOfMemory,
    RedisTooOld,
    SchemaMismatch,
)
from .events import Event, EventStream
from .keys import SCHEMA_VERSION, QueueKeys
from .models import DeadLetter, Delivery, HistoryRecord, Published, SweepResult
from .queue import ReliableQueue
from .sharded import ShardedQueue

__all__ = [
    "SCHEMA_VERSION",
    "BelayqError",
    "ConfigError",
    "ConnectionLost",
    "CrossSlot",
    "DeadLetter",
    "Delivery",
    "DurabilityError",
    "Event",
    "EventStream",
    "EvictionRiskWarning",
    "HistoryRecord",
    "NotPermitted",
    "OutOfMemory",
    "Published",
    "Purged",
    "QueueConfig",
    "QueueKeys",
    "RedisTooOld",
    "ReliableQueue",
    "SchemaMismatch",
    "ShardedQueue",
    "SweepResult",
]
__version__ = "0.1.0"
