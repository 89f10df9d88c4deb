"""belayq: a reliable Redis queue core (BLMOVE claims, fenced leases, Lua settlement, sweep)."""

from importlib.metadata import version as _installed_version

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
    UnknownOption,
)
from .events import Event, EventStream
from .keys import SCHEMA_VERSION, QueueKeys
from .models import DeadLetter, Delivery, HistoryRecord, Lease, Published, SweepResult
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
    "Lease",
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
    "UnknownOption",
]
#: The installed distribution's version (``belayq``, as pip shows it).
__version__ = _installed_version("belayq")
