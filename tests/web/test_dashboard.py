"""The dashboard's API on a real server, served by uvicorn: the lists and counts of belayq's
own, Celery's and RQ's queues, replay, the sweep button, purge with its confirmation, the
demo pool's knobs, and the guard (loopback Host names only, a token off loopback, JSON-only
POSTs). Every bad request is refused with a message and changes nothing."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import redis

from belayq import ReliableQueue
from belayq.errors import ConfigError
from belayq.keys import kombu_layout, rq_layout

web = pytest.importorskip("belayq.web")
from belayq.cli.demo_mode import demo_pool  # noqa: E402


def call(url: str, body: Any = None, *, token: str | None = None, host: str | None = None,
         content_type: str = "application/json") -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data)
    if data is not None:
        req.add_header("Content-Type", content_type)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode()


def test_the_lists_and_counts_of_all_three_kinds(client: redis.Redis, served: Any) -> None:
    own = ReliableQueue(client, "emails", keeper=False, lease_ms=60_000)
    kombu = ReliableQueue(client, "celery", keeper=False, **kombu_layout("celery"))
    rq = ReliableQueue(client, "default", keeper=False, **rq_layout("default"))
    own.publish_many([b"first", b"second", b"third"])
    kombu.publish(json.dumps({"headers": {"task": "proj.add", "id": "t-1"}}).encode())
    rq.publish(b"job-1")
    [held] = own.claim(timeout=0)
    with served(web.create_app(client)) as base:
        status, o = call(f"{base}/api/overview")
        assert status == 200 and o["demo"] is None
        assert {(q["kind"], q["queue"], q["ready"]) for q in o["queues"]} == {
            ("belayq", "emails", 2), ("kombu", "celery", 1), ("rq", "default", 1)}
        status, d = call(f"{base}/api/queue/belayq/emails")
        assert status == 200 and d["stats"]["in_flight"] == 1
        assert [r["payload"] for r in d["ready"]] == ["second", "third"]  # claim order
        [row] = d["in_flight"]
        assert row["id"] == held.id and 0 < row["lease_left_s"] <= 60 and not row["hung"]
        assert row["held_by"] == f"{socket.gethostname()}:{os.getpid()}"
        status, d = call(f"{base}/api/queue/kombu/celery")
        assert [r["task"] for r in d["ready"]] == ["proj.add"]
        status, d = call(f"{base}/api/queue/rq/default")
        assert [r["payload"] for r in d["ready"]] == ["job-1"]
        status, err = call(f"{base}/api/queue/belayq/nope")
        assert status == 404 and "nope" in err["error"]
        status, err = call(f"{base}/api/queue/bogus/emails")
        assert status == 404 and "bogus" in err["error"]  # no queue of that kind here


def test_replay_sweep_and_purge(client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "jobs", keeper=False, lease_ms=200)
    q.publish_many([b"a", b"b", b"c", b"d"])
    a, b, c = q.claim(timeout=0, count=3)
    q.dead_letter(a, "bad a")
    q.dead_letter(b, "bad b")
    with served(web.create_app(client)) as base:
        api = f"{base}/api/queue/belayq/jobs"
        assert sorted(r["reason"] for r in call(api)[1]["dead"]) == ["bad a", "bad b"]
        assert call(f"{api}/replay", {"ids": a.id}) == (400, {
            "error": "ids must be a non-empty list of non-empty strings"})
        assert call(f"{api}/replay", {})[0] == 400
        assert call(f"{api}/replay", {"all": True})[0] == 400  # unconfirmed
        assert call(f"{api}/replay", {"all": True, "confirm": "other"})[0] == 400
        assert q.stats()["dead"] == 2
        assert call(f"{api}/replay", {"ids": [a.id]}) == (200, {"replayed": 1})
        assert call(f"{api}/replay", {"all": True, "confirm": "jobs"}) == (200, {"replayed": 1})
        time.sleep(0.3)  # c's lease (200 ms) runs out: no keeper extends it
        status, swept = call(f"{api}/sweep", {})
        assert status == 200 and swept["reclaimed"] == 1
        assert q.stats()["ready"] == 4 and q.stats()["in_flight"] == 0
        assert call(f"{api}/purge", {"confirm": "other"})[0] == 400
        assert q.stats()["ready"] == 4
        assert call(f"{api}/purge", {"confirm": "jobs"}) == (200, {
            "purged": 4, "ready": 4, "delayed": 0})
    del c


def test_the_guard(client: redis.Redis, served: Any) -> None:
    q = ReliableQueue(client, "jobs", keeper=False)
    q.publish(b"x")
    with pytest.raises(ConfigError, match="needs a token"):
        web.create_app(client, host="0.0.0.0")
    with served(web.create_app(client)) as base:
        status, _ = call(f"{base}/api/overview", host="evil.example")  # DNS rebinding
        assert status == 400
        status, err = call(f"{base}/api/queue/belayq/jobs/purge", {"confirm": "jobs"},
                           content_type="text/plain")  # what a cross-site form can send
        assert status == 415 and q.stats()["ready"] == 1
        assert call(f"{base}/api/queue/belayq/jobs/purge")[0] == 405  # a GET
        page = urllib.request.urlopen(f"{base}/", timeout=10).read().decode()
        assert "/static/app.js" in page and "http" not in page.split("<body>")[1].split(
            "</body>")[0]  # nothing loaded from elsewhere
    with served(web.create_app(client, host="0.0.0.0", token="t0ken"), host="0.0.0.0") as base:
        assert call(f"{base}/api/overview")[0] == 401
        assert call(f"{base}/api/overview", token="wrong")[0] == 401
        assert call(f"{base}/api/overview", token="t0ken")[0] == 200
        assert call(f"{base}/api/overview", token="t0ken", host="anything.example")[0] == 200
        assert call(f"{base}/api/queue/belayq/jobs/purge", {"confirm": "jobs"})[0] == 401
        assert q.stats()["ready"] == 1


def test_a_dashboard_bound_to_any_loopback_address_answers_its_own_host(
        client: redis.Redis, served: Any) -> None:
    """Bound to 127.0.0.2, the dashboard answers a browser that names it (Host 127.0.0.2,
    with its port) and any loopback name, and still refuses every other Host."""
    ReliableQueue(client, "jobs", keeper=False).publish(b"x")
    with served(web.create_app(client, host="127.0.0.2"), host="127.0.0.2") as base:
        assert base.startswith("http://127.0.0.2:")
        port = base.rsplit(":", 1)[1]
        status, o = call(f"{base}/api/overview")  # Host: 127.0.0.2:<port>, as a browser sends
        assert status == 200 and [q["queue"] for q in o["queues"]] == ["jobs"]
        for name in ("localhost", f"127.0.0.1:{port}", f"[::1]:{port}", "127.9.9.9"):
            assert call(f"{base}/api/overview", host=name)[0] == 200, name
        for name in ("evil.example", f"evil.example:{port}", "127.0.0.2.evil.example",
                     "localhost.evil.example"):
            assert call(f"{base}/api/overview", host=name)[0] == 400, name
        with urllib.request.urlopen(f"{base}/", timeout=10) as resp:
            assert resp.status == 200  # the page too


def test_the_demo_pool_knobs_and_bad_input(client: redis.Redis, served: Any) -> None:
    pool = demo_pool(client, "demo-jobs", 1_000)
    try:
        with served(web.create_app(client, demo=pool)) as base:
            assert call(f"{base}/api/demo/enqueue", {"kind": "fax", "count": 5})[0] == 400
            assert call(f"{base}/api/demo/enqueue", {"kind": "email", "count": 0})[0] == 400
            assert call(f"{base}/api/demo/workers", {"size": 2, "fail_rate": 0.7,
                                                     "hang_rate": 0.5})[0] == 400
            assert pool.producer.stats().get("published", 0) == 0 and pool.state()["alive"] == 0
            assert call(f"{base}/api/demo/enqueue", {"kind": "email", "count": 30}) == (
                200, {"enqueued": 30})
            status, state = call(f"{base}/api/demo/workers",
                                 {"size": 3, "latency_ms": 0, "fail_rate": 0, "hang_rate": 0})
            assert status == 200 and state["alive"] == 3
            deadline = time.monotonic() + 20
            while pool.producer.stats().get("acked", 0) < 30:
                assert time.monotonic() < deadline, pool.producer.stats()
                time.sleep(0.05)
            d = call(f"{base}/api/queue/belayq/demo-jobs")[1]
            assert len(d["completed"]) == 30 and json.loads(d["completed"][0]["result"])[
                "kind"] == "email"
            assert call(f"{base}/api/demo/stop", {})[1]["alive"] == 0
    finally:
        pool.stop()


def test_the_commands(tmp_path: Any) -> None:
    """``belayq demo --web`` on its embedded Redis serves the page and the demo API, and
    stops its Redis when stopped; ``belayq dashboard`` off loopback without a token is a
    one-line error with status 2."""
    import os
    import signal
    import subprocess
    import sys

    from belayq.embedded import free_port
    from tests.support import wait_for

    out = subprocess.run([sys.executable, "-m", "belayq", "dashboard", "--url",
                          "redis://127.0.0.1:1/0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "BELAYQ_TOKEN"}
    demo = subprocess.Popen([sys.executable, "-m", "belayq", "demo", "--web", "--port",
                             str(port), "--visibility-ms", "2000"], env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert demo.stdout is not None
        banner = demo.stdout.readline()
        assert "belayq demo on" in banner and "visibility 2000 ms" in banner
        redis_port = int(banner.split("redis://127.0.0.1:")[1].split("/")[0])
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(base), 20, "the demo page")
        assert call(f"{base}/api/demo/enqueue", {"kind": "invoice", "count": 7}) == (
            200, {"enqueued": 7})
        [row] = call(f"{base}/api/overview")[1]["queues"]
        assert (row["queue"], row["ready"]) == ("demo-jobs", 7)
        assert call(f"{base}/api/queue/belayq/demo-jobs")[1]["lease_ms"] == 2000
        out = subprocess.run([sys.executable, "-m", "belayq", "dashboard", "--url",
                              f"redis://127.0.0.1:{redis_port}/0", "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 2 and "needs a token" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(20)
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=redis_port, socket_connect_timeout=1).ping()  # stopped with it


def _up(base: str) -> bool:
    try:
        return urllib.request.urlopen(base + "/", timeout=2).status == 200
    except OSError:
        return False


def test_the_dashboards_replay_and_delete_run_in_batches_as_belayq_replay_does(
        client: redis.Redis, served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dead letter replayed or deleted from the page goes in scripts of at most
    actions.BATCH, as ``belayq replay`` sends them: no one call holds Redis for long."""
    from belayq.actions import BATCH

    q = ReliableQueue(client, "jobs", keeper=False, lease_ms=100, max_deliveries=1)
    total = 2 * BATCH + 500
    for start in range(0, total, 1000):
        q.publish_many([b"m%d" % i for i in range(start, min(total, start + 1000))])
    while q.claim(timeout=0, count=1000):
        pass
    time.sleep(0.2)
    while q.sweep().dead_lettered:
        pass
    assert q.stats()["dead"] == total
    sizes: list[int] = []
    real = ReliableQueue._dead_letters

    def counted(self: ReliableQueue, call: str, ids: Any, limit: int, *, discard: bool) -> int:
        sizes.append(len(ids) if ids is not None else limit)
        return real(self, call, ids, limit, discard=discard)

    monkeypatch.setattr(ReliableQueue, "_dead_letters", counted)
    with served(web.create_app(client)) as base:
        api = f"{base}/api/queue/belayq/jobs"
        assert call(f"{api}/replay", {"all": True, "confirm": "jobs"})[1]["replayed"] == total
        assert max(sizes) <= BATCH and len(sizes) == 3, sizes
        while q.claim(timeout=0, count=1000):
            pass
        time.sleep(0.2)
        while q.sweep().dead_lettered:
            pass
        ids = [d.id for d in q.dead_letters(total)]
        sizes.clear()
        assert call(f"{api}/delete", {"ids": ids})[1]["deleted"] == total
        assert max(sizes) <= BATCH and q.stats()["dead"] == 0, sizes
