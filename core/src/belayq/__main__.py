"""``python -m belayq``: the ``belayq`` command (see belayq.cli). The schema upgrade's older
spelling, ``python -m belayq upgrade --url U --queue Q [--kombu | --rq]``, still works."""

from __future__ import annotations

import sys

from .cli import main


def _legacy_upgrade(argv: list[str]) -> list[str]:
    """``upgrade --queue Q [--kombu|--rq]`` as ``upgrade Q --kind kombu|rq|belayq``."""
    if argv[:1] != ["upgrade"] or "--queue" not in argv:
        return argv
    out = ["upgrade"]
    kind = "belayq"
    rest = argv[1:]
    while rest:
        arg = rest.pop(0)
        if arg == "--queue":
            out.append(rest.pop(0))
        elif arg in ("--kombu", "--rq"):
            kind = arg[2:]
        else:
            out.append(arg)
    return [*out, "--kind", kind]


if __name__ == "__main__":
    sys.exit(main(_legacy_upgrade(sys.argv[1:])))
