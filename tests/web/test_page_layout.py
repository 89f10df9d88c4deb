"""The console's layout and navigation in a real headless Chromium: a failed job's row
buttons are whole at common widths, a message's detail closes when another queue opens,
and the banner that says the server may evict queue data."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import rq

import belayq_rq
from belayq import ReliableQueue
from tests.plugins.rq import jobs
from tests.support import wait_for

from .browser import rows

web = pytest.importorskip("belayq.web")

#: True when the element is drawn whole: inside its cell, and its text not cut.
WHOLE = """el => {
  const cell = el.closest("td"), r = el.getBoundingClientRect(), c = cell.getBoundingClientRect();
  return r.left >= c.left - 0.5 && r.right <= c.right + 0.5 && el.scrollWidth <= el.clientWidth
    && cell.scrollWidth <= cell.clientWidth;
}"""


@pytest.mark.parametrize("width", [1400, 1920])
def test_a_failed_rq_jobs_row_buttons_are_whole(client: redis.Redis, served: Any, page: Any,
                                                width: int) -> None:
    producer = rq.Queue("reports", connection=client)
    failing = producer.enqueue(jobs.fail)
    belayq_rq.SimpleWorker(["reports"], connection=client).work(burst=True,
                                                               logging_level="WARNING")
    page.set_viewport_size({"width": width, "height": 1000})
    with served(web.create_app(client)) as base:
        page.goto(f"{base}/#/queue/rq/reports")
        wait_for(lambda: rows(page, "list-framework-failed") == [failing.id], 20,
                 "the failed job in the page")
        row = page.locator(f"[data-testid=list-framework-failed] tr[data-id='{failing.id}']")
        for testid in ("retry-one", "delete-failed-one"):
            button = row.get_by_test_id(testid)
            assert button.is_visible()
            assert button.evaluate(WHOLE), (testid, width, button.evaluate(
                "el => [el.getBoundingClientRect().right, "
                "el.closest('td').getBoundingClientRect().right]"))


def test_an_open_detail_closes_when_another_queue_opens(client: redis.Redis, served: Any,
                                                        page: Any) -> None:
    first = ReliableQueue(client, "first", keeper=False)
    second = ReliableQueue(client, "second", keeper=False)
    mid = first.publish(b'{"n": 1}')
    other = second.publish(b'{"n": 2}')
    with served(web.create_app(client)) as base:
        page.goto(f"{base}/#/queue/belayq/first")
        wait_for(lambda: rows(page, "list-ready") == [mid], 10, "the first queue's message")
        page.locator(f"[data-testid=list-ready] tr[data-id='{mid}']").click()
        dialog = page.get_by_test_id("message-dialog")
        dialog.wait_for(state="visible")
        page.evaluate("location.hash = '#/queue/belayq/second'")  # a link, back or forward
        wait_for(lambda: page.get_by_test_id("queue-name").inner_text() == "second", 10,
                 "the second queue's page")
        dialog.wait_for(state="hidden")
        page.go_back()
        wait_for(lambda: page.get_by_test_id("queue-name").inner_text() == "first", 10,
                 "the first queue's page again")
        assert dialog.is_hidden()
        # search opens a message of another queue: its page, with the detail open
        page.get_by_test_id("search").fill(other)
        page.get_by_test_id("search-go").click()
        wait_for(lambda: page.get_by_test_id("queue-name").inner_text() == "second", 10,
                 "the page of the queue the search found")
        dialog.wait_for(state="visible")
        assert page.get_by_test_id("message-id").inner_text() == other
        page.get_by_test_id("message-state").wait_for()
        assert page.get_by_test_id("message-state").inner_text() == "ready"


def test_the_eviction_banner(client: redis.Redis, served: Any, page: Any) -> None:
    ReliableQueue(client, "jobs", keeper=False).publish(b"x")
    before = client.config_get("maxmemory*")
    with served(web.create_app(client)) as base:
        page.goto(f"{base}/#/")
        page.get_by_test_id("overview-row").first.wait_for()
        banner = page.get_by_test_id("eviction-banner")
        assert banner.is_hidden()
        client.config_set("maxmemory", "1gb")  # a limit: the policy applies
        client.config_set("maxmemory-policy", "allkeys-lru")
        try:
            banner.wait_for(state="visible")
            assert "allkeys-lru" in banner.inner_text()
            assert banner.locator("a").get_attribute("href", timeout=5_000).startswith("https://")
        finally:
            client.config_set("maxmemory-policy", before["maxmemory-policy"])
            client.config_set("maxmemory", before["maxmemory"])
        banner.wait_for(state="hidden")
