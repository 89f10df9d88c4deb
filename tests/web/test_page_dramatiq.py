"""The console in a real headless Chromium on a Dramatiq queue (belayq_dramatiq.Broker, with
Dramatiq's own Worker): a waiting message's detail as Dramatiq sent it, and a run that
raised, opened with its traceback and deleted."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker

from belayq_dramatiq import Broker
from tests.support import wait_for

from .browser import confirm, number, rows, said

web = pytest.importorskip("belayq.web")


def test_a_dramatiq_message_and_a_failed_run(client: redis.Redis, served: Any,
                                             page: Any) -> None:
    port = client.connection_pool.connection_kwargs["port"]
    broker = Broker(url=f"redis://127.0.0.1:{port}/0")

    runs: list[str] = []

    @dramatiq.actor(broker=broker, max_retries=1, min_backoff=10, max_backoff=20,
                    queue_name="mail")
    def deliver(address: str) -> None:
        runs.append(address)
        if len(runs) == 1:  # the first run raises; its retry goes through
            raise ValueError(f"no route to {address}")

    waiting = deliver.send_with_options(args=("ann@example.com",), delay=3_600_000)
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        failed = deliver.send("bob@example.com")
        wait_for(lambda: len(runs) == 2, 20, "the failed run and its retry")
        broker.store("mail").core.flush_observations()
    finally:
        worker.stop()
    with served(web.create_app(client)) as base:
        page.goto(f"{base}/#/queue/dramatiq/mail")
        wait_for(lambda: rows(page, "list-framework-failed") == [failed.message_id], 20,
                 "the failed run in the page")
        assert number(page, "n-delayed") == 1
        assert page.get_by_test_id("retry-all").is_hidden()
        page.locator(f"[data-testid=list-framework-failed] tr[data-id='{failed.message_id}']"
                     ).click()
        page.get_by_test_id("exc-info").wait_for()
        assert "ValueError: no route to bob@example.com" in page.get_by_test_id(
            "exc-info").inner_text()
        assert page.get_by_test_id("message-state").inner_text() == "failed"
        assert page.get_by_test_id("job-function").inner_text() == "deliver"
        assert "Dramatiq's failed run" in page.get_by_test_id("message-body").inner_text()
        page.get_by_test_id("message-delete-failed").click()
        assert failed.message_id in confirm(page)
        said(page, "Deleted 1 failed job.")
        wait_for(lambda: number(page, "n-framework-failed") == 0, 10, "no failed run left")
        # the waiting (delayed) message, as Dramatiq sent it
        [delayed] = rows(page, "list-delayed")
        page.locator(f"[data-testid=list-delayed] tr[data-id='{delayed}']").click()
        page.get_by_test_id("message-args").wait_for()
        assert page.get_by_test_id("message-state").inner_text() == "delayed"
        assert page.get_by_test_id("job-function").inner_text() == "deliver"
        assert '"ann@example.com"' in page.get_by_test_id("message-args").inner_text()
        assert waiting.message_id in page.get_by_test_id("message-body").inner_text()
    broker.close()
