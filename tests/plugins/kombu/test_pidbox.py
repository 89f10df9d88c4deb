"""Celery's remote control leaves nothing behind on ``belayq://``: a ``celery inspect``
(through belayq, or through the stock ``redis://`` transport, as celery-exporter is run)
against belayq workers creates no counters, memo or record of its reply queue, and the
workers' own pidbox queues are neither recorded nor listed."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import redis

from belayq.discovery import list_queues
from belayq.keys import registry_key

from .conftest import CELERY, HERE


def pidbox_keys(r: redis.Redis) -> list[bytes]:
    return sorted(k for k in r.scan_iter(match="*pidbox*", count=1000)
                  if b"_kombu.binding" not in k)


@pytest.mark.parametrize("scheme", ["belayq", "redis"])
def test_celery_inspect_leaves_no_keys_and_no_record(
    workers: Any, celery_env: dict[str, str], port: int, scheme: str
) -> None:
    workers("-P", "solo").wait_ready()
    r = redis.Redis(port=port)
    env = dict(celery_env, BQ_BROKER=f"{scheme}://127.0.0.1:{port}/0")
    for _ in range(3):
        out = subprocess.run([*CELERY, "-A", "worker_app", "inspect", "ping", "-t", "5"],
                             env=env, cwd=HERE, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "pong" in out.stdout, out.stderr[-2000:]
    assert pidbox_keys(r) == []
    assert not [f for f in r.hkeys(registry_key()) if b"pidbox" in f]
    assert not [f for f in list_queues(r) if "pidbox" in f.name]
