"""belayq under Dramatiq: a worker killed with kill -9 gets its messages run again by
another worker within the lease, acks are fenced, and delayed messages wait in Redis.

``dramatiq.set_broker(belayq_dramatiq.Broker(url="redis://..."))`` in place of
``RedisBroker``; actors, middleware and the ``dramatiq`` command do not change.
"""

from importlib.metadata import version as _installed_version

from .broker import Broker
from .consumer import Consumer, Proxy, StartReports

__all__ = ["Broker", "Consumer", "Proxy", "StartReports"]
#: The installed distribution's version (``belayq-dramatiq``, as pip shows it).
__version__ = _installed_version("belayq-dramatiq")
