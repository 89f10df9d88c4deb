"""The few numbers and the text table every benchmark report is made of."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def med(values: Sequence[float]) -> float:
    """The median, as a float (raises on no values)."""
    return float(statistics.median(values))


def med_or_none(values: Sequence[float]) -> float | None:
    """The median, or None when there are no values."""
    return med(values) if values else None


def spread(values: Sequence[float], fmt: str) -> str:
    """``median (min-max)``, each formatted with ``fmt``."""
    return f"{format(med(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def span(values: Sequence[float], fmt: str) -> str:
    """:func:`spread`, or the value alone when there is one."""
    return format(values[0], fmt) if len(values) == 1 else spread(values, fmt)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table with its columns padded to the widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(header), sep, *(fmt(r) for r in rows)])
