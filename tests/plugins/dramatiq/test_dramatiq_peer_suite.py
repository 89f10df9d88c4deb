"""Dramatiq's own tests, from the sdist of the installed version, with belayq_dramatiq's
Broker swapped in (peer/run_dramatiq_suite.py --all): its Redis broker tests, and its
StubBroker tests (actors, middleware, composition, results, worker) on the Redis broker.
Every failure must be one the runner lists as expected, with its reason.

About a minute, so it runs under CI=true (or BELAYQ_PEER=1) only, in the background from
the end of collection on (tests/conftest.py), overlapping the rest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from importlib import metadata

import pytest

from tests import background
from tests.conftest import CI, unavailable
from tests.plugins.dramatiq.conftest import ROOT

#: The least each Dramatiq minor's sdist must pass with belayq swapped in (its Redis broker
#: tests, its StubBroker tests on Redis), a little under what it passed here (1.17.1: 13 and
#: 72; 2.0.1: 12 and 77; 2.1.0: 12 and 79; 2.2.1: 12 and 84): older sdists ship fewer tests.
#: A newer minor is held to the newest's.
PASSED = {"1.17": (12, 68), "2.0": (12, 73), "2.1": (12, 75), "2.2": (12, 80)}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dramatiq_own_tests_pass_with_belayq_swapped_in() -> None:
    if not (CI or os.environ.get("BELAYQ_PEER") == "1"):
        pytest.skip("Dramatiq's own tests take about a minute: run under CI=true or BELAYQ_PEER=1")
    if shutil.which("unshare") is None:
        unavailable("`unshare` is needed to give Dramatiq's tests a private localhost:6379")
    code, stdout, stderr = background.get("dramatiq-peer").wait(580)
    for summary in re.findall(r"^Dramatiq \S+ .*", stdout, re.M):
        print(summary)
    assert code == 0, stdout[-6000:] + stderr[-3000:]
    version = metadata.version("dramatiq")
    redis_tests, on_redis = (
        json.loads((ROOT / ".peer" / f"dramatiq-{version}-{mode}-results.json").read_text())
        for mode in ("belayq", "belayq-on-redis")
    )
    redis_floor, on_redis_floor = PASSED.get(version.rsplit(".", 1)[0], PASSED["2.2"])
    assert redis_tests["unexpected"] == [] and redis_tests["passed"] >= redis_floor
    assert on_redis["unexpected"] == [] and on_redis["passed"] >= on_redis_floor
