"""The console's actions and history in a real headless Chromium: dead letters replayed and
deleted, each confirmed first (a cancelled confirmation sends nothing; "all" needs the
queue's name typed), purge, the pause buttons (shown only where the server has the pause
endpoints), and the history graph drawn from the per-minute rollups on a time axis."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.rollups import SNAPSHOT
from tests.support import wait_for

from .browser import confirm, number, rows, said, shoot

web = pytest.importorskip("belayq.web")


def log_of(page: Any) -> list[str]:
    """The actions the page's log shows, newest first."""
    return [str(a) for a in page.locator("[data-testid=list-actions] tbody tr td:nth-child(2)")
            .all_inner_texts() if a]


def test_dead_letters_replayed_and_deleted_with_confirmation(
        client: redis.Redis, served: Any, page: Any, tmp_path: Path) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish_many([b'{"n": 1}', b'{"n": 2}', b'{"n": 3}', b'{"n": 4}', b'{"n": 5}'])
    held = q.claim(timeout=0, count=3)
    for i, d in enumerate(held):
        q.dead_letter(d, f"TimeoutError: job {i} took too long")
    with served(web.create_app(client)) as base:
        page.goto(base + "/#/queue/belayq/jobs")
        wait_for(lambda: len(rows(page, "list-dead")) == 3, 10, "three dead letters")
        assert "history_max" in page.get_by_test_id("history-off").first.inner_text()
        assert page.get_by_test_id("graph-empty").is_visible()  # no rollups yet
        page.get_by_test_id("pause").wait_for(state="visible")  # not paused: Pause only
        assert page.get_by_test_id("resume").is_hidden()

        one = f"[data-testid=list-dead] tr[data-id='{held[0].id}']"
        page.locator(f"{one} [data-testid=replay-one]").click()
        asked = confirm(page, ok=False)
        assert held[0].id in asked
        said(page, "Cancelled")
        page.locator(f"{one} [data-testid=delete-one]").click()
        page.get_by_test_id("confirm-dialog").wait_for(state="visible")
        page.keyboard.press("Escape")  # cancels too
        page.get_by_test_id("confirm-dialog").wait_for(state="hidden")
        time.sleep(1.2)  # a refresh: nothing changed
        assert q.stats()["dead"] == 3 and number(page, "n-dead") == 3
        assert log_of(page) == [] and not client.llen(q.keys.actions)

        page.locator(f"{one} [data-testid=replay-one]").click()
        confirm(page)
        said(page, "Replayed 1 dead letter.")
        wait_for(lambda: number(page, "n-dead") == 2 and number(page, "n-ready") == 3, 10,
                 "the replayed dead letter")
        assert q.stats()["ready"] == 3 and held[0].id not in rows(page, "list-dead")

        page.locator(f"[data-testid=list-dead] tr[data-id='{held[1].id}']").click()
        page.get_by_test_id("message-delete").click()  # from the message's own detail
        confirm(page)
        said(page, "Deleted 1 dead letter.")
        wait_for(lambda: rows(page, "list-dead") == [held[2].id], 10, "one dead letter left")
        assert not client.hexists(q.keys.payloads, held[1].id)

        page.get_by_test_id("delete-all-dead").click()
        ok = page.get_by_test_id("confirm-ok")
        assert ok.is_disabled()
        page.get_by_test_id("confirm-name").fill("job")
        assert ok.is_disabled()
        page.get_by_test_id("confirm-name").fill("jobs")
        assert ok.is_enabled()
        shoot(page, "confirm.png", tmp_path)
        ok.click()
        said(page, "Deleted 1 dead letter.")
        wait_for(lambda: number(page, "n-dead") == 0, 10, "no dead letters")
        assert q.stats()["dead"] == 0
        wait_for(lambda: log_of(page) == ["delete", "delete", "replay"], 10, "the log")

        page.get_by_test_id("purge").click()
        confirm(page, typed="jobs")
        said(page, "Purged 3 messages.")
        wait_for(lambda: number(page, "n-ready") == 0, 10, "the purged queue")
        assert q.stats()["ready"] == 0


def test_pause_and_resume_from_the_page(client: redis.Redis, served: Any, page: Any) -> None:
    """Pause, confirmed, stops the queue handing out messages and shows it paused, in the
    overview too; a cancelled confirmation changes nothing; Resume hands them out again.
    Both are in the queue's log."""
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish_many([b"x", b"y"])
    with served(web.create_app(client)) as base:
        page.goto(base + "/#/queue/belayq/jobs")
        page.get_by_test_id("pause").wait_for(state="visible")
        page.get_by_test_id("pause").click()
        confirm(page, ok=False)
        assert q.stats()["paused"] == 0
        page.get_by_test_id("pause").click()
        confirm(page)
        said(page, "Paused jobs.")
        assert q.stats()["paused"] == 1 and q.claim(timeout=0) == []
        page.get_by_test_id("resume").wait_for(state="visible")
        assert page.get_by_test_id("pause").is_hidden()
        page.goto(base + "/#/")
        paused_row = page.locator("[data-testid=overview] tr", has_text="jobs")
        wait_for(lambda: "paused" in paused_row.inner_text(), 10, "the paused badge")
        page.goto(base + "/#/queue/belayq/jobs")
        page.get_by_test_id("resume").wait_for(state="visible")
        page.get_by_test_id("resume").click()
        confirm(page)
        wait_for(lambda: q.stats()["paused"] == 0, 10, "the resume")
        assert [d.payload for d in q.claim(timeout=0)] == [b"x"]
        page.get_by_test_id("pause").wait_for(state="visible")
        actions = page.get_by_test_id("list-actions")
        wait_for(lambda: "resume" in actions.inner_text(), 10, "the log")
        assert "pause" in actions.inner_text()


MINUTE_MS = 60_000


def snapshot(**counts: int) -> str:
    return " ".join(str(counts.get(name, 0)) for name in SNAPSHOT)


def test_the_history_graph(client: redis.Redis, served: Any, page: Any, tmp_path: Path) -> None:
    q = ReliableQueue(client, "orders", keeper=False, lease_ms=30_000, history_max=50)
    q.publish_many([f'{{"order": {i}}}'.encode() for i in range(40)])
    for d in q.claim(timeout=0, count=12):
        q.ack(d, result='{"charged": true}')
    q.dead_letter(q.claim(timeout=0)[0], "CardDeclined: insufficient funds")
    q.claim(timeout=0, count=2)  # held
    q.publish(b'{"order": "later"}', delay_ms=600_000)
    now = int(client.time()[0]) // 60
    # Cumulative counters per minute (one snapshot a minute, as the lease keepers write):
    # one busy minute 3 hours ago, then a burst 29 minutes ago and 9 busy minutes after it.
    seeded = {
        now - 200: snapshot(),
        now - 199: snapshot(published=40, claimed=40, acked=40),
        now - 30: snapshot(published=40, claimed=40, acked=40),
        now - 29: snapshot(published=100, claimed=90, acked=80, nacked=6, reclaimed=3,
                           adopted=1, dead_lettered=2, failed=5),
        now - 20: snapshot(published=280, claimed=270, acked=260, nacked=6, reclaimed=3,
                           adopted=1, dead_lettered=2, failed=23),
    }
    client.hset(q.keys.rollups, mapping={str(m): v for m, v in seeded.items()})
    with served(web.create_app(client)) as base:
        page.goto(base + "/#/queue/belayq/orders")
        total = {k: (lambda k=k: number(page, f"graph-total-{k}")) for k in
                 ("completed", "failed", "reclaimed", "dead_lettered", "published")}
        # The failed runs are the framework's (acked all the same, as Celery and RQ do):
        # the nacks are not failed runs, and a failed run is not completed.
        wait_for(lambda: total["completed"]() == 220 - 23, 10, "the last hour's completed")
        assert (total["published"](), total["failed"](), total["reclaimed"](),
                total["dead_lettered"]()) == (240, 23, 4, 2)
        assert page.get_by_test_id("graph-empty").is_hidden()
        ticks = page.get_by_test_id("time-tick").all_inner_texts()
        assert 5 <= len(ticks) <= 6, ticks
        minutes = [int(t[:2]) * 60 + int(t[3:]) for t in ticks]
        assert all(re.fullmatch(r"\d\d:\d0", t) for t in ticks), ticks
        assert all((b - a) % 1440 == 10 for a, b in itertools.pairwise(minutes)), ticks
        last = time.gmtime(time.time())
        assert (last.tm_hour * 60 + last.tm_min - minutes[-1]) % 1440 < 10  # ends now
        green = page.evaluate("""() => {
            const c = document.querySelector("[data-testid=graph]");
            const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            let n = 0;
            for (let i = 0; i < px.length; i += 4)
                if (Math.abs(px[i] - 21) < 12 && Math.abs(px[i + 1] - 128) < 12
                    && Math.abs(px[i + 2] - 61) < 12 && px[i + 3] > 200) n++;
            return n; }""")
        assert green > 40, green  # the completed line is drawn
        assert number(page, "n-acked") == 12 and number(page, "n-dead") == 1
        assert "charged" in page.get_by_test_id("list-completed").inner_text()
        assert "CardDeclined" in page.get_by_test_id("list-failed").inner_text()
        shoot(page, "queue.png", tmp_path)

        page.get_by_test_id("graph-range").select_option("360")
        wait_for(lambda: total["completed"]() == 260 - 23, 10, "6 hours: the older minute too")
        assert total["published"]() == 280
        hours = page.get_by_test_id("time-tick").all_inner_texts()
        assert len(hours) == 6 and all(h.endswith(":00") for h in hours), hours
        page.get_by_test_id("graph-range").select_option("1440")
        wait_for(lambda: len(page.get_by_test_id("time-tick").all_inner_texts()) == 8, 10,
                 "a tick every 3 hours")
        assert all(int(h[:2]) % 3 == 0 for h in page.get_by_test_id("time-tick")
                   .all_inner_texts())
