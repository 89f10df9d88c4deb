"""``belayq demo --web``'s run scripted through the page itself in a real headless Chromium,
read back from the page's own numbers: jobs enqueued in batches, a pool of workers that
fail and hang some runs, the reclaim sweep, every job completed or failed for good, none
lost; the pool's badge says when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support import wait_for

from .browser import confirm, number, shoot

web = pytest.importorskip("belayq.web")
from belayq.cli.demo_mode import demo_pool  # noqa: E402

KINDS = ("email", "webhook", "thumbnail", "invoice")


def sweep(page: Any) -> None:
    page.get_by_test_id("sweep").click()
    confirm(page)


def test_the_demo_run_through_the_page(client: redis.Redis, served: Any, page: Any,
                                       tmp_path: Path) -> None:
    """200 jobs of four kinds, 8 workers failing 10 % and hanging 10 % of their runs, the
    reclaim sweep run from the page: the page's lists drain, and every job ends completed
    or failed (dead after 3 runs), none lost, by the page's numbers and by Redis."""
    pool = demo_pool(client, "demo-jobs", 1_500)
    try:
        with served(web.create_app(client, demo=pool)) as base:
            page.goto(base + "/")
            badge = page.get_by_test_id("pool-badge")
            badge.wait_for(state="visible")
            assert badge.inner_text() == "stopped"
            page.locator("[data-testid=overview-row][data-queue=demo-jobs]").click()
            page.get_by_test_id("job-count").fill("50")
            for kind in KINDS:
                page.get_by_test_id("job-kind").select_option(kind)
                page.get_by_test_id("enqueue").click()
                wait_for(lambda k=kind: pool.state()["counts"].get("enqueued", 0)
                         == 50 * (KINDS.index(k) + 1), 10, f"the {kind} batch")
            wait_for(lambda: number(page, "n-ready") == 200, 10, "the page to show 200 ready")
            page.get_by_test_id("pool-size").fill("8")
            page.get_by_test_id("pool-latency").fill("150")
            page.get_by_test_id("pool-fail").fill("10")
            page.get_by_test_id("pool-hang").fill("10")
            page.get_by_test_id("start-workers").click()
            wait_for(lambda: badge.inner_text() == "running", 10, "the running badge")
            assert "8 of 8 workers alive" in page.get_by_test_id("pool-state").inner_text()
            wait_for(lambda: pool.state()["counts"].get("hung", 0) >= 3, 30, "hung claims")
            wait_for(lambda: page.locator("[data-testid=list-in-flight] tr.hung").count() > 0,
                     10, "a hung claim shown in the in-flight list")
            shoot(page, "demo-mid-run.png", tmp_path)
            wait_for(lambda: number(page, "n-ready") == 0, 60, "the ready list to drain")
            sweep(page)  # hung claims come back
            wait_for(lambda: "reclaimed" in page.get_by_test_id("sweep-result").inner_text(),
                     10, "the sweep's answer")

            def settled() -> bool:
                if pool.state()["counts"].get("hung", 0) and number(page, "n-reclaimed") < 1:
                    sweep(page)
                return (number(page, "n-ready") == 0 and number(page, "n-in-flight") == 0
                        and number(page, "n-acked") + number(page, "n-dead") == 200)

            wait_for(settled, 90, lambda: page.get_by_test_id("status").inner_text(), step=0.8)
            acked, dead = number(page, "n-acked"), number(page, "n-dead")
            assert number(page, "n-published") == 200 and number(page, "n-reclaimed") >= 1
            assert number(page, "n-nacked") >= 1 and acked > 100
            assert "sweep" in page.get_by_test_id("list-actions").inner_text()
            shoot(page, "demo-drained.png", tmp_path)
            page.get_by_test_id("stop-workers").click()
            wait_for(lambda: badge.inner_text() == "stopped", 20, "the stopped badge")
            assert "0 of 0 workers alive" in page.get_by_test_id("pool-state").inner_text()
            stats = pool.producer.stats()
            assert (stats["acked"], stats["dead"]) == (acked, dead), stats
            assert stats["ready"] == stats["in_flight"] == stats["delayed"] == 0
            completed = {h.id for h in pool.producer.history("done", 50)}
            assert len(completed) == min(50, acked)
            assert len(page.locator("[data-testid=list-completed] tr[data-id]").all()) == \
                min(50, acked)
            for d in pool.producer.dead_letters(200):
                assert d.deliveries == 3 or "lease" in d.reason, d  # ran its 3 runs out
    finally:
        pool.stop()
