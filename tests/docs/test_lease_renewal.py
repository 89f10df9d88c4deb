"""Every page that says how often a worker renews its leases says what the code does: the
lease keeper beats every ``heartbeat_interval_ms`` (a third of the lease) or
``sweep_interval_ms``, whichever is shorter, so every second with the defaults."""

from __future__ import annotations

import re

import pytest

from belayq import ReliableQueue
from belayq.embedded import RedisServer
from tests.conftest import client_of
from tests.docs.commands import ROOT

#: Where the renewal period is stated.
PAGES = ["README.md", "docs/rq.md", "docs/dramatiq.md", "docs/configuration.md"]
#: Statements of it that the code does not keep.
WRONG = [
    r"renews its leases every third of the lease",
    r"renews it every second,",
    r"renewal \(every third of the lease\)",
]


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / page).read_text())


@pytest.mark.parametrize("lease_ms", [20_000, 30_000])
def test_the_keeper_renews_every_second_with_the_default_sweep(
    private_redis: RedisServer, lease_ms: int
) -> None:
    with client_of(private_redis) as client:
        q = ReliableQueue(client, "renewal-period", lease_ms=lease_ms, record=False)
        assert q.heartbeat_ms == 1000  # the sweep period, shorter than a third of the lease
        short = ReliableQueue(client, "short", lease_ms=1500, record=False)
        assert short.heartbeat_ms == 500  # a third of the lease, shorter than the sweep


@pytest.mark.parametrize("page", PAGES)
def test_every_page_states_the_lease_renewal_period_the_code_uses(page: str) -> None:
    text = _text(page)
    for wrong in WRONG:
        assert not re.search(wrong, text), f"{page} says {wrong!r}"
    assert re.search(r"whichever is shorter|min\(this, `sweep_interval_ms`\)", text), page
    assert re.search(r"every second (?:by default|with the defaults)", text), page


