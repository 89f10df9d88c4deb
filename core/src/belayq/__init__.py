"""belayq: a reliable Redis queue core (BLMOVE claims, fenced leases, Lua settlement, sweep)."""

from .config import QueueConfig
from .errors import (
    BelayqError,
    ConfigError,
    ConnectionLost,
    CrossSlot,
    DurabilityError,
    RedisTooOld,
    SchemaMismatch,
)
from .keys import SCHEMA_VERSION, QueueKeys
from .models import DeadLetter, Delivery, Published, SweepResult
from .queue import ReliableQueue

__all__ = [
    "SCHEMA_VERSION",
    "BelayqError",
    "ConfigError",
    "ConnectionLost",
    "CrossSlot",
    "DeadLetter",
    "Delivery",
    "DurabilityError",
    "Published",
    "QueueConfig",
    "QueueKeys",
    "RedisTooOld",
    "ReliableQueue",
    "SchemaMismatch",
    "SweepResult",
]
__version__ = "0.1.0"
