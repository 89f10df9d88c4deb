"""What Dramatiq's tests import from their ``common`` module (not shipped in the sdist)."""

from __future__ import annotations

import contextlib
import platform

import pytest
from dramatiq import Worker


@contextlib.contextmanager
def worker(*args, **kwargs):
    w = Worker(*args, **kwargs)
    try:
        w.start()
        yield w
    finally:
        w.stop()


skip_in_ci = pytest.mark.skipif(False, reason="")
skip_on_windows = pytest.mark.skipif(platform.system() == "Windows", reason="Windows")
skip_on_pypy = pytest.mark.skipif(platform.python_implementation() == "PyPy", reason="PyPy")
