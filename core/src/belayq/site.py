"""Where the docs site is, for the messages that point to it: the address a user who
installed the package from PyPI can open (the package's metadata names it)."""

from __future__ import annotations

from importlib import metadata

#: Where the docs are, when the package's metadata does not say.
DOCS_URL = "https://belayq.github.io/belayq"
#: The page of the docs site that explains the eviction policies.
EVICTION_PAGE = "managed-redis/"


def docs_url() -> str:
    """The docs site, as the installed package's metadata names it (ends with ``/``)."""
    try:
        urls = metadata.metadata("belayq").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return str(url).strip().rstrip("/") + "/"
    return DOCS_URL + "/"
