"""Option names an adapter takes, and the one error for a name nobody reads.

The adapters share these so that a misspelled belayq option reads the same everywhere:
``belayq_rq.Queue(lease_msec=5000)``, ``belayq_dramatiq.Broker(lease_msec=5000)`` and a
``belayq://`` transport option ``visibilty_timeout`` each raise one
:class:`~belayq.errors.UnknownOption` that names the option, the closest valid name and
every valid one, before anything is sent to Redis.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from .errors import UnknownOption

#: How alike two names must be (``difflib`` ratio, case, ``_`` and ``-`` ignored) for one
#: to count as a misspelling of the other. ``lease_msec`` is 0.88 like ``lease_ms``,
#: ``max_delivery`` 0.85 like ``max_deliveries``; RQ's ``result_ttl`` or ``ttl`` is no
#: belayq option's.
MISSPELLED_RATIO = 0.8

#: How alike a name must be to a valid one for the error to suggest it.
SUGGESTED_RATIO = 0.6


def _plain(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def closest(name: str, valid: Iterable[str], *, ratio: float = SUGGESTED_RATIO) -> str | None:
    """The name in ``valid`` that ``name`` is most alike, if at least ``ratio`` alike
    (case, ``_`` and ``-`` ignored), else None."""
    by_plain: dict[str, str] = {}
    for option in sorted(valid):
        by_plain.setdefault(_plain(option), option)
    found = difflib.get_close_matches(_plain(name), list(by_plain), n=1, cutoff=ratio)
    return by_plain[found[0]] if found else None


def misspells(name: str, options: Iterable[str]) -> str | None:
    """The option of ``options`` that ``name`` (not one of them) misspells, or None."""
    options = set(options)
    if name in options:
        return None
    return closest(name, options, ratio=MISSPELLED_RATIO)


def unknown_option(
    name: str, valid: Iterable[str], *, what: str, hint: str = "", more: str = ""
) -> UnknownOption:
    """The error for ``name``, which no ``what`` (e.g. ``belayq_rq.Queue option``) is.

    Args:
        name: The name given.
        valid: Every name that is such an option; the closest one is suggested.
        what: What the options are, as the message names them.
        hint: Said instead of the suggestion (e.g. where the option belongs).
        more: Said after the list of valid names (e.g. ``or a redis.Redis parameter``).
    """
    valid = sorted(set(valid))
    if not hint:
        near = closest(name, valid)
        hint = f"did you mean {near!r}?" if near else ""
    return UnknownOption(
        f"unknown {what} {name!r}{'; ' + hint if hint else ''} "
        f"(valid: {', '.join(valid)}{' ' + more if more else ''})"
    )


def refuse_unknown(names: Iterable[str], valid: Iterable[str], *, what: str,
                   more: str = "") -> None:
    """Refuse the first of ``names`` (sorted) that is not in ``valid``.

    Raises:
        UnknownOption: See :func:`unknown_option`.
    """
    valid = set(valid)
    for name in sorted(names):
        if name not in valid:
            raise unknown_option(name, valid, what=what, more=more)


def refuse_misspelled(names: Iterable[str], options: Iterable[str], *, what: str,
                      more: str = "") -> list[str]:
    """Refuse the first of ``names`` (sorted) that misspells one of ``options``; return the
    names that are neither one of ``options`` nor a misspelling of one (sorted).

    Raises:
        UnknownOption: Naming the misspelled option, the one it misspells and every one of
            ``options``.
    """
    options = set(options)
    rest = []
    for name in sorted(names):
        if name in options:
            continue
        near = misspells(name, options)
        if near is not None:
            raise unknown_option(name, options, what=what, hint=f"did you mean {near!r}?",
                                 more=more)
        rest.append(name)
    return rest
