"""Subprocesses of RQ's test suite (rqworker, rq, SpawnWorker children) get belayq_rq's
classes too, when the peer-suite runner sets BELAYQ_RQ_SWAP=1."""

import os

if os.environ.get("BELAYQ_RQ_SWAP") == "1":
    import belayq_rq_swap  # noqa: F401  (swaps on import)
