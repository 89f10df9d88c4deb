"""Every adapter names a misspelled belayq option the same way, with the core's one helper:
one :class:`~belayq.UnknownOption` (a ``TypeError`` and a ``ValueError``) that names the
option, the closest valid one and every valid one, raised before anything reaches Redis."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import kombu
import pytest
import redis

import belayq_dramatiq
import belayq_kombu  # noqa: F401  (registers belayq://)
import belayq_rq
from belayq import UnknownOption

# The first port no server listens on: a refused option must fail before any connection.
NOWHERE = "redis://127.0.0.1:1/0"


def _rq(**options: Any) -> Any:
    return belayq_rq.Queue("q", connection=redis.Redis.from_url(NOWHERE), **options)


def _dramatiq(**options: Any) -> Any:
    return belayq_dramatiq.Broker(url=NOWHERE, **options)


def _kombu(**options: Any) -> Any:
    return kombu.Connection(NOWHERE.replace("redis", "belayq"),
                            transport_options=options).connect()


@pytest.mark.parametrize(("build", "what", "given", "meant", "lists"), [
    (_rq, "belayq_rq.Queue option", "lease_msec", "lease_ms",
     "belayq_options, lease_ms, max_deliveries"),
    (_rq, "belayq_rq.Queue option", "max_delivery", "max_deliveries", "lease_ms"),
    (_dramatiq, "belayq_dramatiq.Broker option", "lease_msec", "lease_ms",
     "belayq_options, lease_ms, max_deliveries, shards, stock_delays, strict_runs"),
    (_dramatiq, "belayq_dramatiq.Broker option", "max_delivery", "max_deliveries", "shards"),
    (_dramatiq, "belayq_dramatiq.Broker option", "strict_run", "strict_runs", "lease_ms"),
    (_kombu, "belayq:// transport option", "visibilty_timeout", "visibility_timeout",
     "max_deliveries"),
    (_kombu, "belayq:// transport option", "max_delivery", "max_deliveries", "sweep_interval"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_every_adapter_names_a_misspelled_option_the_same_way(
    build: Callable[..., Any], what: str, given: str, meant: str, lists: str
) -> None:
    with pytest.raises(UnknownOption) as raised:
        build(**{given: 5})
    message = str(raised.value)
    assert re.match(rf"unknown {re.escape(what)} '{given}'; did you mean '{meant}'\? "
                    rf"\(valid: .*\)$", message), message
    assert lists in message
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, ValueError)


def test_a_misspelled_dramatiq_option_is_not_handed_to_redis_py() -> None:
    """Stock RedisBroker passes it to ``redis.Redis``, whose ``TypeError`` names neither
    the option meant nor the broker's."""
    with pytest.raises(UnknownOption, match="did you mean 'lease_ms'") as raised:
        belayq_dramatiq.Broker(url=NOWHERE, lease_msec=5000)
    assert "Redis.__init__" not in str(raised.value)


def test_a_dramatiq_broker_names_a_misplaced_queue_option_and_takes_redis_parameters(
) -> None:
    with pytest.raises(UnknownOption, match=r"belayq_options=\{'sweep_interval_ms'"):
        belayq_dramatiq.Broker(url=NOWHERE, sweep_interval_ms=500)
    with pytest.raises(UnknownOption, match="did you mean 'socket_timeout'"):
        belayq_dramatiq.Broker(url=NOWHERE, socket_timout=5)
    # redis.Redis's own parameters and stock's maintenance settings pass as before
    belayq_dramatiq.Broker(url=NOWHERE, socket_timeout=5, maintenance_chance=10).close()
    # beside a client, stock ignores **parameters: so does the drop-in, with a warning
    with pytest.warns(UserWarning, match="'not_a_parameter'"):
        belayq_dramatiq.Broker(redis.Redis.from_url(NOWHERE), not_a_parameter=1).close()
