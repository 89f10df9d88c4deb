"""belayq as a kombu transport: Celery's ``broker_url = "belayq://host:6379/0"``.

Importing this package registers the ``belayq`` and ``belayqs`` (TLS) URL schemes with
kombu. Without the import, ``broker_transport = "belayq_kombu:Transport"`` (with a
``redis://`` URL) selects the transport by its class path.
"""

from __future__ import annotations

from importlib.metadata import version as _installed_version

from kombu.transport import TRANSPORT_ALIASES

from .transport import Channel, QoS, SSLTransport, Transport

#: URL scheme -> transport class path. kombu 5.7 allows letters, digits and '-' in schemes.
SCHEMES = {
    "belayq": "belayq_kombu.transport:Transport",
    "belayqs": "belayq_kombu.transport:SSLTransport",
}

#: kombu reads ``belayq+cluster://`` as transport ``belayq``; its failover ``switch()`` to
#: the next of several URLs reads it whole, so the whole scheme must name the transport too.
ALIASES = {
    f"{scheme}+{inner}": path
    for scheme, path in SCHEMES.items()
    for inner in ("cluster", "clusters", "sentinel", "sentinels")
}


def register() -> None:
    """Register the URL schemes in kombu's transport aliases (idempotent)."""
    for scheme, path in {**SCHEMES, **ALIASES}.items():
        TRANSPORT_ALIASES.setdefault(scheme, path)


register()

#: The installed distribution's version (``belayq-kombu``, as pip shows it).
__version__ = _installed_version("belayq-kombu")

__all__ = ["SCHEMES", "Channel", "QoS", "SSLTransport", "Transport", "register"]
