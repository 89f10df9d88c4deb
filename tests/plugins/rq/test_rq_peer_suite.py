"""RQ's own test suite, from the rq sdist of the installed version, with belayq_rq's Queue
and Workers swapped in (peer/run_rq_suite.py). Every failure must be one the runner lists
as expected, with its reason and the belayq test that replaces it.

About 2-4 minutes on a 2-core box, so it runs under CI=true (or BELAYQ_PEER=1) only, and
in the background from the end of collection on (tests/conftest.py), overlapping the rest.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from tests import background
from tests.conftest import CI, unavailable
from tests.plugins.rq.conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rq_own_suite_passes_with_belayq_swapped_in() -> None:
    if not (CI or os.environ.get("BELAYQ_PEER") == "1"):
        pytest.skip("RQ's own suite takes 2-4 min: runs under CI=true or BELAYQ_PEER=1")
    if shutil.which("unshare") is None:
        unavailable("`unshare` is needed to give RQ's suite a private localhost:6379")
    code, stdout, stderr = background.get("rq-peer").wait(880)  # started when collected
    summary = re.search(r"^RQ \S+ test suite, belayq_rq.*", stdout, re.M | re.S)
    print(summary.group(0) if summary else stdout[-3000:])
    assert code == 0, stdout[-6000:] + stderr[-3000:]
    from importlib import metadata

    results = json.loads(
        (ROOT / ".peer" / f"rq-{metadata.version('rq')}-belayq-results.json").read_text()
    )
    assert results["unexpected"] == [] and results["passed"] > 500
