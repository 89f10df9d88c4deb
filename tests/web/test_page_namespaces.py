"""The console in a real headless Chromium on two Dramatiq apps that share one Redis, apart
by their ``namespace``, each with its queue ``default``: each line of the overview opens its
own app's queue, whose address (bookmarked, or reloaded) opens it again, and whose messages
open with their own app's detail."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
import redis

from belayq_dramatiq import Broker
from tests.support import wait_for

from .browser import number

web = pytest.importorskip("belayq.web")


def ready_rows(page: Any) -> list[str]:
    """The lines of the queue page's ready list."""
    return [str(t) for t in
            page.locator("[data-testid=list-ready] tr[data-id]").all_inner_texts()]


def test_two_apps_queues_of_one_name_each_open_their_own_detail(
    client: redis.Redis, served: Any, page: Any
) -> None:
    apps = {"mine": Broker(client=client), "theirs": Broker(client=client, namespace="app2")}
    sent = []
    for count, (app, broker) in enumerate(apps.items(), start=1):  # mine 1, theirs 2
        broker.declare_queue("default")
        sent += [broker.enqueue(dramatiq.Message(
            queue_name="default", actor_name="deliver", args=(app, i), kwargs={},
            options={})).message_id for i in range(count)]
    with served(web.create_app(client)) as base:
        page.goto(base + "/")
        lines = page.locator("[data-testid=overview-row][data-queue=default]")
        wait_for(lambda: lines.count() == 2, 20, "the two apps' queues in the overview")
        for app, ready in (("theirs", 2), ("mine", 1), ("theirs", 2)):
            page.goto(base + "/")
            lines.first.wait_for()
            line = next(lines.nth(i) for i in range(2)
                        if lines.nth(i).locator("td").nth(2).inner_text() == str(ready))
            assert ("app2" in line.inner_text()) == (app == "theirs")  # which app's it is

            def own(app: str = app, ready: int = ready) -> bool:
                shown = ready_rows(page)
                return len(shown) == ready and all(f'"{app}"' in r for r in shown)

            line.click()
            wait_for(own, 20, f"{app} queue's own messages")
            assert number(page, "n-ready") == ready
            assert page.get_by_test_id("queue-namespace").is_visible() == (app == "theirs")
            page.reload()  # the address names the app's queue: it opens the same one again
            wait_for(own, 20, f"{app} queue's own messages, reloaded")
            page.locator("[data-testid=list-ready] tr[data-id]").first.click()
            page.get_by_test_id("message-args").wait_for()
            assert f'"{app}"' in page.get_by_test_id("message-args").inner_text()
            assert page.get_by_test_id("message-state").inner_text() == "ready"
            page.get_by_test_id("message-close").click()
        page.goto(base + "/")  # found by its id: opened in its own app's queue
        page.get_by_test_id("search").fill(sent[-1])
        page.get_by_test_id("search").press("Enter")
        page.get_by_test_id("message-args").wait_for()
        assert '"theirs"' in page.get_by_test_id("message-args").inner_text()
        assert "namespace=app2" in page.url
    for broker in apps.values():
        broker.close()
