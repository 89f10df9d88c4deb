"""The console in a real headless Chromium: the overview of a fleet (a Celery queue filled by
Celery's own producer, an RQ queue with a job a real RQ worker failed, a belayq queue),
sorted by its headers; a Celery task's detail; a Celery task a real worker failed, with its
traceback; an RQ failed job's traceback, requeued from
the page; and the keyboard ("/" to search, Enter on a row, Escape on the dialog).

``python -m tests.web.screenshots docs/img`` keeps the screenshots the docs show."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import rq
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq://)
import belayq_rq
from belayq import ReliableQueue
from tests.plugins.kombu.conftest import HERE as KOMBU_TESTS
from tests.plugins.kombu.conftest import Worker
from tests.plugins.rq import jobs
from tests.support import wait_for

from .browser import confirm, number, overview_order, rows, said, shoot

web = pytest.importorskip("belayq.web")


def celery_app(client: redis.Redis) -> Celery:
    port = client.connection_pool.connection_kwargs["port"]
    return Celery("shop", broker=f"belayq://127.0.0.1:{port}/0")


def celery_queue(stem: str) -> str:
    """A Celery queue name no other test of this process used: kombu remembers, per
    process, the bindings it declared, so it would not declare them again on the server
    emptied for this test."""
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def failed_rq_jobs(client: redis.Redis, name: str, count: int) -> list[rq.job.Job]:
    """``count`` jobs of ``tests.plugins.rq.jobs.fail`` that a real RQ worker ran and failed."""
    producer = rq.Queue(name, connection=client)
    failing = [producer.enqueue(jobs.fail) for _ in range(count)]
    belayq_rq.SimpleWorker([name], connection=client).work(burst=True, logging_level="WARNING")
    assert rq.registry.FailedJobRegistry(name, connection=client).count == count
    return failing


def test_the_overview_of_a_fleet_sorted(client: redis.Redis, served: Any, page: Any,
                                        tmp_path: Path) -> None:
    app = celery_app(client)
    invoices = celery_queue("celery")
    for i in range(12):
        app.send_task("shop.send_invoice", args=[i], queue=invoices)
    failed_rq_jobs(client, "reports", 1)
    reports = rq.Queue("reports", connection=client)
    for _ in range(2):
        reports.enqueue(jobs.add, 1, 2)
    emails = ReliableQueue(client, "emails", keeper=False, lease_ms=60_000)
    emails.publish_many([b"hello"] * 1_200)
    emails.claim(timeout=0, count=3)
    with served(web.create_app(client)) as base:
        page.goto(base + "/")
        wait_for(lambda: len(overview_order(page)) == 3, 10, "the three queues")
        row = page.locator("[data-testid=overview-row][data-queue=emails]")
        cells = row.locator("td").all_inner_texts()
        assert cells[:6] == ["belayq", "emails", "1,197", "0", "3", "0"], cells
        assert page.locator(f"[data-testid=overview-row][data-queue={invoices}] td").nth(0) \
            .inner_text() == "kombu"
        reports_cells = page.locator("[data-testid=overview-row][data-queue=reports] td")
        assert reports_cells.nth(6).inner_text() == "1"  # its framework's failed job
        emails.publish_many([b"more"] * 60)  # a rate in: the next looks see it
        wait_for(lambda: row.locator("td").nth(7).inner_text() not in ("\u2013", "0"), 10,
                 "a rate in for emails")

        assert overview_order(page) == [invoices, "emails", "reports"]  # by name at first
        page.get_by_test_id("sort-ready").click()
        assert overview_order(page) == ["emails", invoices, "reports"]  # most first
        header = page.locator("th:has([data-testid=sort-ready])")
        assert header.get_attribute("aria-sort") == "descending"
        page.get_by_test_id("sort-ready").click()
        assert overview_order(page) == ["reports", invoices, "emails"]
        assert header.get_attribute("aria-sort") == "ascending"
        page.get_by_test_id("sort-failed").click()
        assert overview_order(page)[0] == "reports"  # the only one with failures; none last
        page.get_by_test_id("sort-kind").click()
        assert overview_order(page) == ["emails", invoices, "reports"]  # belayq, kombu, rq
        time.sleep(1.5)  # a refresh keeps the order chosen
        assert overview_order(page) == ["emails", invoices, "reports"]
        shoot(page, "overview.png", tmp_path)

        page.locator(f"[data-testid=overview-row][data-queue={invoices}]").click()
        wait_for(lambda: number(page, "n-ready") == 12, 10, "the Celery queue's page")
        assert page.url.endswith(f"#/queue/kombu/{invoices}")
        assert page.get_by_test_id("queue-name").inner_text() == invoices
        assert "shop.send_invoice" in page.get_by_test_id("list-ready").inner_text()


def test_a_celery_tasks_detail(client: redis.Redis, served: Any, page: Any,
                               tmp_path: Path) -> None:
    billing = celery_queue("billing")
    sent = celery_app(client).send_task("shop.charge", args=(42, "EUR"),
                                        kwargs={"retry": True, "note": "first try"},
                                        queue=billing)
    with served(web.create_app(client)) as base:
        page.goto(base + "/")
        page.locator(f"[data-testid=overview-row][data-queue={billing}]").click()
        wait_for(lambda: rows(page, "list-ready"), 10, "the task in the ready list")
        page.locator("[data-testid=list-ready] tr[data-id]").click()
        dialog = page.get_by_test_id("message-dialog")
        dialog.wait_for(state="visible")
        page.get_by_test_id("message-task").wait_for()
        assert page.get_by_test_id("message-task").inner_text() == "shop.charge"
        assert page.get_by_test_id("message-state").inner_text() == "ready"
        body = page.get_by_test_id("message-body").inner_text()
        assert sent.id in body  # the task id, and its root (itself)
        args = page.get_by_test_id("message-args").inner_text()
        assert args.split() == ["[", "42,", '"EUR"', "]"]  # pretty JSON
        kwargs = page.get_by_test_id("message-kwargs").inner_text()
        assert '"retry": true' in kwargs and '"note": "first try"' in kwargs
        shoot(page, "message-celery.png", tmp_path)
        page.get_by_test_id("message-close").click()
        dialog.wait_for(state="hidden")


def test_a_failed_celery_task_with_its_traceback(client: redis.Redis, served: Any, page: Any,
                                                 tmp_path: Path) -> None:
    """A real ``celery worker`` runs a task that raises; the page lists the failed run, opens
    it with its traceback, offers no requeue (the task's retry policy owns that), and
    deletes it."""
    port = client.connection_pool.connection_kwargs["port"]
    queue = celery_queue("charges")
    env = dict(os.environ, BQ_BROKER=f"belayq://127.0.0.1:{port}/0", BQ_QUEUE=queue,
               BQ_BACKEND=f"redis://127.0.0.1:{port}/1",
               PYTHONPATH=os.pathsep.join([str(KOMBU_TESTS), os.environ.get("PYTHONPATH", "")]))
    worker = Worker(env, tmp_path / "worker.log", f"w-{uuid.uuid4().hex[:6]}@%h",
                    ["--pool=solo"])
    try:
        worker.wait_ready()
        sent = celery_app(client).send_task("worker_app.boom", args=(7,), queue=queue)
        with served(web.create_app(client)) as base:
            page.goto(f"{base}/#/queue/kombu/{queue}")
            wait_for(lambda: rows(page, "list-framework-failed") == [sent.id], 30,
                     lambda: f"the failed run in the page; worker: {worker.text()[-2000:]}")
            assert number(page, "n-framework-failed") == 1
            assert page.get_by_test_id("retry-all").is_hidden()
            assert page.get_by_test_id("list-framework-failed").locator(
                "[data-testid=retry-one]").count() == 0
            page.locator(f"[data-testid=list-framework-failed] tr[data-id='{sent.id}']").click()
            page.get_by_test_id("exc-info").wait_for()
            traceback = page.get_by_test_id("exc-info").inner_text()
            assert traceback.startswith("Traceback")
            assert "ValueError: task 7 always fails" in traceback
            assert page.get_by_test_id("message-state").inner_text() == "failed"
            assert page.get_by_test_id("job-function").inner_text() == "worker_app.boom"
            assert page.get_by_test_id("job-reason").inner_text() == (
                "ValueError: task 7 always fails")
            assert page.get_by_test_id("message-retry").count() == 0
            shoot(page, "celery-failed.png", tmp_path)
            page.get_by_test_id("message-delete-failed").click()
            assert sent.id in confirm(page)
            said(page, "Deleted 1 failed job.")
            wait_for(lambda: number(page, "n-framework-failed") == 0, 10, "no failed run left")
    finally:
        worker.stop()


def test_an_rq_failed_job_opened_and_requeued(client: redis.Redis, served: Any, page: Any,
                                              tmp_path: Path) -> None:
    failing = failed_rq_jobs(client, "reports", 2)
    registry = rq.registry.FailedJobRegistry("reports", connection=client)
    producer = rq.Queue("reports", connection=client)
    with served(web.create_app(client)) as base:
        page.goto(base + "/#/queue/rq/reports")
        wait_for(lambda: len(rows(page, "list-framework-failed")) == 2, 10, "the failed jobs")
        assert number(page, "n-framework-failed") == 2
        assert "this job always fails" in page.get_by_test_id("list-framework-failed").inner_text()
        page.locator(f"[data-testid=list-framework-failed] tr[data-id='{failing[0].id}']").click()
        page.get_by_test_id("exc-info").wait_for()
        traceback = page.get_by_test_id("exc-info").inner_text()
        assert traceback.startswith("Traceback")
        assert "ValueError: this job always fails" in traceback
        assert page.get_by_test_id("job-function").inner_text() == "tests.plugins.rq.jobs.fail"
        assert page.get_by_test_id("job-status").inner_text() == "failed"
        shoot(page, "rq-failed.png", tmp_path)

        page.get_by_test_id("message-retry").click()
        asked = confirm(page)
        assert failing[0].id in asked
        said(page, "Requeued 1 failed job.")
        wait_for(lambda: rows(page, "list-framework-failed") == [failing[1].id], 10,
                 "the requeued job gone from the failed list")
        assert registry.count == 1 and producer.job_ids == [failing[0].id]
        assert number(page, "n-ready") == 1

        page.get_by_test_id("retry-all").click()
        confirm(page, typed="reports")
        said(page, "Requeued 1 failed job.")
        wait_for(lambda: page.get_by_test_id("panel-framework-failed")
                 .locator("tr.none").count() == 1, 10, "an empty failed list")
        assert registry.count == 0 and set(producer.job_ids) == {j.id for j in failing}
        log = page.get_by_test_id("list-actions").inner_text()
        assert log.count("retry") == 2, log


def test_the_keyboard(client: redis.Redis, served: Any, page: Any) -> None:
    orders = ReliableQueue(client, "orders", keeper=False)
    first = orders.publish(b'{"order": 1}')
    ReliableQueue(client, "emails", keeper=False).publish(b"x")
    with served(web.create_app(client)) as base:
        page.goto(base + "/")
        wait_for(lambda: len(overview_order(page)) == 2, 10, "the queues")
        page.keyboard.press("/")
        focused = "document.activeElement && document.activeElement.dataset.testid"
        assert page.evaluate(focused) == "search"
        page.keyboard.type(first)
        page.keyboard.press("Enter")
        dialog = page.get_by_test_id("message-dialog")
        dialog.wait_for(state="visible")
        assert page.get_by_test_id("message-id").inner_text() == first
        page.get_by_test_id("message-json").wait_for()
        assert '"order": 1' in page.get_by_test_id("message-json").inner_text()
        assert page.url.endswith("#/queue/belayq/orders")  # search opened the queue too
        page.keyboard.press("/")  # no search while a dialog is open
        assert page.evaluate(focused) != "search"
        page.keyboard.press("Escape")
        dialog.wait_for(state="hidden")

        page.keyboard.press("/")
        page.keyboard.type("no-such-message")
        page.keyboard.press("Enter")
        wait_for(lambda: "No queue knows" in page.get_by_test_id("search-result").inner_text(),
                 10, "the search's answer")

        page.get_by_test_id("back").click()
        page.locator("[data-testid=overview-row][data-queue=orders]").focus()
        page.keyboard.press("Enter")
        wait_for(lambda: page.url.endswith("#/queue/belayq/orders"), 10, "the queue's page")
        expand = page.locator("[data-testid=list-ready] [data-testid=id-expand]")
        expand.wait_for()
        assert expand.inner_text() != first and expand.get_attribute("aria-expanded") == "false"
        expand.focus()
        page.keyboard.press("Enter")
        wait_for(lambda: expand.inner_text() == first, 5, "the full id")
        assert expand.get_attribute("aria-expanded") == "true"
        time.sleep(1.2)  # a refresh keeps it open, and the focus on it
        assert expand.inner_text() == first and page.evaluate(focused) == "id-expand"
        row = page.locator("[data-testid=list-ready] tr[data-id]")
        row.focus()
        page.keyboard.press("Enter")
        dialog.wait_for(state="visible")
        assert page.get_by_test_id("message-id").inner_text() == first
        page.keyboard.press("Escape")
        dialog.wait_for(state="hidden")
