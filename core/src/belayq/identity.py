"""What tells two queues apart on one server: their kind, their namespace, their name.

Two applications may share one Redis as their frameworks allow: Dramatiq apps with their
own ``namespace``, Celery apps with their own ``global_keyprefix``. Their queues of one name
are two queues, each with its own lists and its own record in the registry
(:mod:`belayq.registry`), under a field that names all three parts
(:func:`registry_field`). A queue in its framework's default namespace keeps the field
earlier belayqs gave every queue (``<kind>/<name>``), and a record an earlier belayq wrote
for a queue of another namespace is read under the namespace its ready list names
(:func:`namespace_of`).
"""

from __future__ import annotations

from .keys import DRAMATIQ_NAMESPACE, dramatiq_messages


def registry_field(kind: str, name: str, namespace: str = "") -> str:
    """The registry field of queue ``name`` of ``kind`` in ``namespace``: ``<kind>/<name>``
    in the framework's default namespace (as earlier belayqs wrote every record),
    ``<kind>:<namespace>/<name>`` in another (``/`` and ``%`` of the namespace escaped, so
    no two queues share a field)."""
    if not namespace:
        return f"{kind}/{name}"
    escaped = namespace.replace("%", "%25").replace("/", "%2F")
    return f"{kind}:{escaped}/{name}"


def namespace_of(kind: str, name: str, ready_key: str | None,
                 payloads_key: str | None = None) -> str:
    """The namespace of a queue recorded without one (by an earlier belayq), from its
    layout: Dramatiq's ``namespace`` from stock RedisBroker's list (``<namespace>:<name>``,
    its bodies in ``<list>.msgs``), kombu's ``global_keyprefix`` from its list
    (``<keyprefix><name>``), when not the default; ``""`` otherwise (belayq's own keys of
    an adapter's queue included: ``belayq:dramatiq:{<name>}``)."""
    if ready_key is None:
        return ""
    for bare in (name, f"{{{name}}}"):
        if kind == "dramatiq" and ready_key.endswith(f":{bare}") \
                and payloads_key == dramatiq_messages(ready_key):
            found = ready_key[: -len(bare) - 1]
            return "" if found == DRAMATIQ_NAMESPACE else found
        if kind == "kombu" and ready_key.endswith(bare) and ready_key != bare:
            return ready_key[: -len(bare)]
    return ""
