"""``celery purge -f`` on ``belayq://`` does what it does to a running stock fleet: the
waiting tasks go, the countdown and ETA tasks stay (stock workers hold them in memory,
where a purge never reaches), and ``belayq purge --delayed`` deletes those on purpose."""

from __future__ import annotations

import subprocess

import redis

from belayq.cli import main

from .conftest import CELERY, HERE


def test_celery_purge_keeps_countdown_tasks(celery_env: dict[str, str], kq: str, port: int,
                                            capsys: object) -> None:
    from celery import Celery

    app = Celery("producer", broker=celery_env["BQ_BROKER"])
    for i in range(5):
        app.send_task("worker_app.add", (i, i), queue=kq)
    for i in range(3):
        app.send_task("worker_app.add", (i, i), queue=kq, countdown=600)
    out = subprocess.run([*CELERY, "-A", "worker_app", "purge", "-f", "-Q", kq],
                         env=celery_env, cwd=HERE, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Purged 5 messages" in out.stdout
    r = redis.Redis(port=port)
    assert r.llen(kq) == 0
    url = f"redis://127.0.0.1:{port}/0"
    assert main(["stats", "--url", url, kq, "--kind", "kombu", "--json"]) == 0
    assert '"delayed": 3' in capsys.readouterr().out  # type: ignore[attr-defined]
    assert main(["purge", "--url", url, kq, "--kind", "kombu", "--delayed", "--yes"]) == 0
    assert "0 ready, 3 delayed" in capsys.readouterr().out  # type: ignore[attr-defined]
