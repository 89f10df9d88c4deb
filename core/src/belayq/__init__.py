"""belayq: a reliable Redis queue core (BLMOVE claims, fenced leases, Lua settlement, sweep)."""

from .config import QueueConfig
from .errors import (
    BelayqError,
    ConfigError,
    ConnectionLost,
    CrossSlot,
    LeaseLost,
    RedisTooOld,
    SchemaMismatch,
    StaleToken,
)
from .keys import SCHEMA_VERSION, QueueKeys
from .models import DeadLetter, Delivery, SweepResult
from .queue import ReliableQueue

__all__ = [
    "SCHEMA_VERSION",
    "BelayqError",
    "ConfigError",
    "ConnectionLost",
    "CrossSlot",
    "DeadLetter",
    "Delivery",
    "LeaseLost",
    "QueueConfig",
    "QueueKeys",
    "RedisTooOld",
    "ReliableQueue",
    "SchemaMismatch",
    "StaleToken",
    "SweepResult",
]
__version__ = "0.1.0"
