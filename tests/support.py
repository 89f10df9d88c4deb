"""Helpers the test packages share (fixtures live in the conftest files)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: Any, step: float = 0.05
) -> Any:
    """Poll ``predicate`` every ``step`` s until it returns something true, and return that;
    fail after ``timeout`` s, naming ``what`` (a str, or a callable giving one, called only
    when the wait failed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {shown}")
        time.sleep(step)
