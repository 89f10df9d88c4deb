"""belayq under RQ: a worker killed with kill -9, or a work horse killed by the OOM killer,
gets its job run again by another worker within the lease, instead of a FAILED
``AbandonedJobError`` minutes later.

Use ``rq worker -w belayq_rq.Worker`` (or ``belayq_rq.SimpleWorker``), or build
``belayq_rq.Queue`` / ``belayq_rq.Worker`` in code. Producers need no change.
"""

from importlib.metadata import version as _installed_version

from .queue import Queue
from .worker import BelayqWorkerMixin, FewerRoundTripsMixin, HerokuWorker, SimpleWorker, Worker

__all__ = [
    "BelayqWorkerMixin",
    "FewerRoundTripsMixin",
    "HerokuWorker",
    "Queue",
    "SimpleWorker",
    "Worker",
]
#: The installed distribution's version (``belayq-rq``, as pip shows it).
__version__ = _installed_version("belayq-rq")
