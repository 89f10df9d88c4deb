"""``ReliableQueue.report_started``: a process that does not hold a claim (a process pool's
worker, whose parent claimed it) reports its run as started, at once and counted once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from belayq.admin import parse_meta
from tests.conftest import make_client


@pytest.fixture(params=["redis", "redis62"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    c = make_client(request, request.param)
    yield c
    c.close()


def _attempts(q: Any, msg_id: str) -> int:
    meta = parse_meta(q.client.hget(q.keys.meta, msg_id))
    assert meta is not None
    return int(meta["attempts"])


def test_a_start_reported_by_another_process_counts_once_and_refuses_a_stale_token(
    make_queue: Any, client: Any
) -> None:
    holder = make_queue(client, lease_ms=5_000, claim_starts=False)
    runner = make_queue(client, lease_ms=5_000, claim_starts=False)  # holds nothing
    holder.publish(b"job")
    [d] = holder.claim(timeout=1)
    assert _attempts(holder, d.id) == 0
    assert runner.report_started([(d.id, d.token)]) == [True]
    assert _attempts(holder, d.id) == 1
    assert runner.report_started([(d.id, d.token)]) == [True]
    holder.start([d], now=True)  # the holder's own later report of the same run
    assert _attempts(holder, d.id) == 1
    assert runner.report_started([(d.id, "not-the-token")]) == [False]
    assert runner.held == [] and runner.report_started([]) == []
    assert holder.ack(d)


def test_report_started_with_claim_starts_changes_nothing(make_queue: Any, client: Any) -> None:
    q = make_queue(client, lease_ms=5_000, claim_starts=True)
    q.publish(b"job")
    [d] = q.claim(timeout=1)
    assert _attempts(q, d.id) == 1
    assert q.report_started([(d.id, d.token)]) == [True]
    assert _attempts(q, d.id) == 1
