"""``retry_later("defer", ...)``: a deferral that could not reach Redis is retried by the
keeper's beats, and lands with what was left of its wait, not the whole wait again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ConfigError
from tests.conftest import make_client


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    c = make_client(request, "redis")
    yield c
    c.close()


def test_a_retried_deferral_waits_only_what_was_left(make_queue: Any, client: Any) -> None:
    q = make_queue(client, lease_ms=10_000, claim_starts=False)
    q.publish(b"later")
    [d] = q.claim(timeout=1)
    q.retry_later("defer", [d], delays_ms=[3_000])
    assert q.unsettled == 1 and q.held == [d]
    time.sleep(1.0)
    assert q.retry_unsettled() == 0 and q.held == []
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    [(_, due)] = client.zrange(q.keys.delayed, 0, -1, withscores=True)
    assert 1_500 <= due - now_ms <= 2_100, due - now_ms
    s = q.stats()
    assert (s["in_flight"], s["delayed"]) == (0, 1), s


@pytest.mark.parametrize("op, delays", [("defer", None), ("nack", [1]), ("defer", [1, 2]),
                                         ("defer", [-1]), ("defer", [True]), ("later", None)])
def test_retry_later_refuses_what_does_not_fit(
    make_queue: Any, client: Any, op: str, delays: Any
) -> None:
    q = make_queue(client, lease_ms=10_000)
    q.publish(b"m")
    [d] = q.claim(timeout=1)
    with pytest.raises(ConfigError):
        q.retry_later(op, [d], delays_ms=delays)
    assert q.unsettled == 0
