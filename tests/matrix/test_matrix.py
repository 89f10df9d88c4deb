"""The oldest and the newest of each framework belayq adapts (kombu/Celery 5.3 and 5.7, rq
2.0 and 2.12, Dramatiq 1.17 and 2.2, redis-py 5 and 8), each in its tox env with the tests
its version changes (tests/matrix/run_matrix.py); the newest Dramatiq and redis-py are the
suite's own environment. Every env of tox.ini runs with ``python -m
tests.matrix.run_matrix --all`` outside CI; docs/proof.md has that table.

Several minutes of installs and tests, so it runs under CI=true (or BELAYQ_MATRIX=1) only,
in the background from the end of collection on (tests/background.py), after RQ's suite.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests import background
from tests.conftest import CI, unavailable
from tests.matrix.run_matrix import CI_ENVS, RESULTS


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_oldest_and_newest_framework_versions_pass() -> None:
    if not (CI or os.environ.get("BELAYQ_MATRIX") == "1"):
        pytest.skip("the tox subset takes minutes: runs under CI=true or BELAYQ_MATRIX=1")
    if shutil.which("uvx") is None:
        unavailable("uvx (uv's tool runner) is needed to run tox")
    code, stdout, stderr = background.get("matrix").wait(1480)
    print(stdout)
    results = json.loads(RESULTS.read_text())
    assert [r["env"] for r in results] == CI_ENVS, stderr[-3000:]
    failed = {r["env"]: (r.get("summary"), r.get("failed")) for r in results
              if r["result"] != "pass"}
    for r in results:
        if r.get("report"):
            print(f"--- {r['env']}: its failures ---\n{r['report']}")
    assert not failed, failed
    assert code == 0, stdout[-3000:] + stderr[-3000:]
