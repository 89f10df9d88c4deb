"""belayq core vs the raw redis-py floor, on one private redis-server, in one run.

Run from the repository root: ``python -m benchmarks.core`` (see its ``--help`` and
:mod:`benchmarks.core.__main__`). The modules: :mod:`.counting` (the counting client, one
measurement), :mod:`.loops` (the throughput loops, as a table), :mod:`.memory`,
:mod:`.recovery` (the kill -9 runs and their child), :mod:`.report`.
"""
