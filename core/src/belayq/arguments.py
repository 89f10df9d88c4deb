"""Checks of a call's arguments, made before anything is sent to Redis: a bad argument raises
:class:`~belayq.ConfigError` and changes nothing. The scripts check what they receive too
(``lua/includes/check.lua``), with the same bounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import ConfigError
from .models import Delivery

INT_MAX = 10**15
"""Largest integer argument a script takes (``INT_MAX`` in lua/includes/check.lua): a Lua
number holds it exactly; as ms it is over 30,000 years."""


def check_int(name: str, value: Any, *, minimum: int = 0, maximum: int = INT_MAX) -> int:
    """``value`` if it is an int (not a bool) within ``minimum..maximum``.

    Raises:
        ConfigError: Naming the argument and the value.
    """
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be an int within {minimum}..{maximum}, got {value!r}")
    return value


def check_text(name: str, value: Any) -> str:
    """``value`` if it is a str (empty allowed).

    Raises:
        ConfigError: Naming the argument and the value's type.
    """
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a str, got {type(value).__name__}")
    return value


#: Which queue a claim must come from: ``(queue, shard)`` as :class:`Delivery` names them.
Owner = tuple[str, str]


def check_deliveries(name: str, deliveries: Any, owner: Owner | None = None) -> list[Delivery]:
    """``deliveries`` as a list, if it is a sequence of claims (each as
    :func:`check_delivery` wants it).

    Raises:
        ConfigError: Naming what is wrong.
    """
    if not isinstance(deliveries, Sequence) or isinstance(deliveries, (str, bytes)):
        raise ConfigError(f"{name} must be a sequence of Delivery, got {type(deliveries).__name__}")
    for d in deliveries:
        check_delivery(name, d, owner)
    return list(deliveries)


def check_delivery(name: str, delivery: Any, owner: Owner | None = None) -> Delivery:
    """``delivery`` if it is a claim: a :class:`Delivery` with a non-empty id and token,
    claimed from the queue ``owner`` names (when given): a claim of another queue settled
    here would find nothing it holds.

    Raises:
        ConfigError: Naming what is wrong.
    """
    if not isinstance(delivery, Delivery):
        raise ConfigError(f"{name} takes Delivery objects, got {type(delivery).__name__}")
    if not isinstance(delivery.id, str) or not delivery.id:
        raise ConfigError(f"{name}: a delivery's id must be a non-empty str, got {delivery.id!r}")
    if not isinstance(delivery.token, str) or not delivery.token:
        raise ConfigError(
            f"{name}: a delivery's token must be a non-empty str, got {delivery.token!r}"
        )
    if owner is not None and (delivery.queue, delivery.shard) != owner:
        where = _where(delivery.queue, delivery.shard)
        here = _where(*owner)
        raise ConfigError(
            f"{name}: message {delivery.id!r} was claimed from {where}, not {here}: settle it "
            "with the queue object it was claimed from"
        )
    return delivery


def _where(queue: str, shard: str) -> str:
    return f"queue {queue!r}" + (f" (shard {shard!r})" if shard else "")
