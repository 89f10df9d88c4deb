"""Chaos harness: a real workload through real Celery / RQ workers while workers are killed,
frozen and cut off and the broker Redis restarts; then loss, duplicates and recovery are
counted from a ledger kept on a second, never-faulted redis-server.

Run from the repository root::

    .venv/bin/python -m benchmarks.chaos --stack all --tasks 10000 --minutes 10

See ``python -m benchmarks.chaos --help`` and :mod:`benchmarks.chaos.run`.
"""
