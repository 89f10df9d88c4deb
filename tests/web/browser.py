"""What the browser tests share: the page's numbers read back, the confirmation dialog
answered, and the screenshots the docs use (kept in ``BELAYQ_SCREENSHOTS`` when it is set:
``python -m tests.web.screenshots docs/img``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.support import wait_for


def shoot(page: Any, name: str, tmp_path: Path) -> Path:
    target = Path(os.environ.get("BELAYQ_SCREENSHOTS") or tmp_path) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 10_000
    return target


def number(page: Any, testid: str) -> int:
    """A count the page shows (thousands separators dropped); -1 when it shows none."""
    text = page.get_by_test_id(testid).inner_text().strip().replace(",", "")
    return int(text) if text.isdigit() else -1


def confirm(page: Any, *, typed: str | None = None, ok: bool = True) -> str:
    """Answer the confirmation dialog (typing ``typed`` first); returns what it asked."""
    dialog = page.get_by_test_id("confirm-dialog")
    dialog.wait_for(state="visible")
    asked = str(page.get_by_test_id("confirm-text").inner_text())
    if typed is not None:
        page.get_by_test_id("confirm-name").fill(typed)
    page.get_by_test_id("confirm-ok" if ok else "confirm-cancel").click()
    dialog.wait_for(state="hidden")
    return asked


def said(page: Any, text: str, timeout: float = 10) -> str:
    """Wait until the result of an action says ``text``."""
    out = page.get_by_test_id("action-result")
    return str(wait_for(lambda: text in out.inner_text() and out.inner_text(), timeout,
                        lambda: f"{text!r} in the action's result ({out.inner_text()!r})"))


def rows(page: Any, testid: str) -> list[str]:
    """The message ids of a list's rows."""
    return [str(i) for i in page.locator(f"[data-testid={testid}] tr[data-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.id)")]


def overview_order(page: Any) -> list[str]:
    return [str(q) for q in page.get_by_test_id("overview-row").evaluate_all(
        "rows => rows.map(r => r.dataset.queue)")]
