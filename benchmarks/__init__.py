"""Benchmarks of the belayq core against the raw redis-py floor (run with ``python -m``)."""
