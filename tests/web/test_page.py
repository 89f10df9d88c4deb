"""The page in a real headless Chromium (Debian's, driven by Playwright): the job-queue
seed's run scripted through the page itself, read back from the page's own numbers; and the
dashboard over a queue a real Celery producer fills.

Set BELAYQ_SCREENSHOTS=DIR to keep the screenshots (the docs' come from here)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.keys import kombu_layout
from tests.conftest import unavailable
from tests.support import wait_for

web = pytest.importorskip("belayq.web")
from belayq.cli.demo_mode import demo_pool  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
KINDS = ("email", "webhook", "thumbnail", "invoice")


@pytest.fixture
def page() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        unavailable("no chromium (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def shoot(page: Any, name: str, tmp_path: Path) -> Path:
    target = Path(os.environ.get("BELAYQ_SCREENSHOTS") or tmp_path) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 10_000
    return target


def number(page: Any, testid: str) -> int:
    text = page.get_by_test_id(testid).inner_text().strip()
    return int(text) if text.isdigit() else -1


def test_the_seed_demo_run_through_the_page(client: redis.Redis, served: Any, page: Any,
                                            tmp_path: Path) -> None:
    """200 jobs of four kinds, 8 workers failing 10 % and hanging 10 % of their runs, the
    reclaim button clicked: the page's lists drain, and every job ends completed or failed
    (dead after 3 runs), none lost, by the page's numbers and by Redis."""
    pool = demo_pool(client, "demo-jobs", 1_500)
    try:
        with served(web.create_app(client, demo=pool)) as base:
            page.goto(base + "/")
            page.get_by_test_id("job-count").fill("50")
            for kind in KINDS:
                page.get_by_test_id("job-kind").select_option(kind)
                page.get_by_test_id("enqueue").click()
                wait_for(lambda k=kind: pool.state()["counts"].get("enqueued", 0)
                         == 50 * (KINDS.index(k) + 1), 10, f"the {kind} batch")
            wait_for(lambda: number(page, "n-ready") == 200, 10, "the page to show 200 pending")
            page.get_by_test_id("pool-size").fill("8")
            page.get_by_test_id("pool-latency").fill("150")
            page.get_by_test_id("pool-fail").fill("10")
            page.get_by_test_id("pool-hang").fill("10")
            page.get_by_test_id("start-workers").click()
            wait_for(lambda: pool.state()["counts"].get("hung", 0) >= 3, 30, "hung claims")
            wait_for(lambda: page.locator("[data-testid=list-in-flight] tr.hung").count() > 0,
                     10, "a hung claim shown in the processing list")
            shoot(page, "demo-mid-run.png", tmp_path)
            wait_for(lambda: number(page, "n-ready") == 0, 60, "pending to drain")
            page.get_by_test_id("sweep").click()  # the seed's button: hung claims come back
            wait_for(lambda: "reclaimed" in page.get_by_test_id("sweep-result").inner_text(),
                     10, "the sweep's answer")

            def settled() -> bool:
                if pool.state()["counts"].get("hung", 0) and number(page, "n-reclaimed") < 1:
                    page.get_by_test_id("sweep").click()
                return (number(page, "n-ready") == 0 and number(page, "n-in-flight") == 0
                        and number(page, "n-acked") + number(page, "n-dead") == 200)

            wait_for(settled, 90, lambda: page.get_by_test_id("status").inner_text(), step=0.8)
            acked, dead = number(page, "n-acked"), number(page, "n-dead")
            assert number(page, "n-published") == 200 and number(page, "n-reclaimed") >= 1
            assert number(page, "n-nacked") >= 1 and acked > 100
            shoot(page, "demo-drained.png", tmp_path)
            stats = pool.producer.stats()
            assert (stats["acked"], stats["dead"]) == (acked, dead), stats
            assert stats["ready"] == stats["in_flight"] == stats["delayed"] == 0
            completed = {h.id for h in pool.producer.history("done", 50)}
            assert len(completed) == min(50, acked)
            for d in pool.producer.dead_letters(200):
                assert d.deliveries == 3 or "lease" in d.reason, d  # ran its 3 runs out
    finally:
        pool.stop()


def test_the_dashboard_on_a_celery_queue(client: redis.Redis, served: Any, page: Any,
                                         tmp_path: Path) -> None:
    """Tasks sent by a real Celery producer over ``belayq://``: the page lists them by task
    name, with the claims a consumer holds and a dead letter that the Replay button brings
    back."""
    from celery import Celery

    import belayq_kombu  # noqa: F401  (registers belayq://)

    port = client.connection_pool.connection_kwargs["port"]
    app = Celery("shop", broker=f"belayq://127.0.0.1:{port}/0")
    for i in range(12):
        app.send_task("shop.send_invoice", args=[i])
    for i in range(3):
        app.send_task("shop.resize_image", args=[i])
    q = ReliableQueue(client, "celery", keeper=False, **kombu_layout("celery"))
    held = q.claim(timeout=0, count=4)
    q.dead_letter(held[0], "TaskError: card declined")
    with served(web.create_app(client)) as base:
        page.goto(base + "/")
        wait_for(lambda: number(page, "n-in-flight") == 3, 10, "the held claims")
        assert page.get_by_test_id("queue-select").input_value() == "kombu/celery"
        assert number(page, "n-ready") == 11 and number(page, "n-dead") == 1
        assert "shop.send_invoice" in page.get_by_test_id("list-ready").inner_text()
        assert "card declined" in page.get_by_test_id("list-dead").inner_text()
        shoot(page, "dashboard-celery.png", tmp_path)
        page.locator("[data-testid=list-dead] button.replay").click()
        wait_for(lambda: number(page, "n-dead") == 0 and number(page, "n-ready") == 12, 10,
                 "the replayed dead letter")
    assert q.stats()["dead"] == 0
