"""The parts of the soak (``python -m benchmarks.soak``): the workers' apps of the three
frameworks, the ledger every run writes to, and the census of the server's keys."""
