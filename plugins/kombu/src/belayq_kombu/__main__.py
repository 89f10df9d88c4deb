"""``python -m belayq_kombu``: see :mod:`belayq_kombu.cli`."""

from belayq_kombu.cli import main

raise SystemExit(main())
