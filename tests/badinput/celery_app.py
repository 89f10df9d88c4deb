"""The Celery app of the bad-input and security tests (``celery -A celery_app worker``),
configured from the environment. Tasks record each run (pid, value) in a Redis list on the
result-backend database, so a test sees how often and in which process each one ran."""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery

import belayq_kombu  # noqa: F401  (registers belayq:// and belayqs://)

env = os.environ.get
app = Celery("celery_app", broker=env("BQ_BROKER"), backend=env("BQ_BACKEND"))
_ssl: dict[str, Any] | None = (
    {"ssl_cert_reqs": "required", "ssl_ca_certs": env("BQ_CA")} if env("BQ_CA") else None
)
app.conf.update(
    task_default_queue=env("BQ_QUEUE", "celery"),
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_use_ssl=_ssl,
    redis_backend_use_ssl=_ssl,
    broker_transport_options={
        "visibility_timeout": float(env("BQ_LEASE", "5")),
        "max_deliveries": 3,
        "sweep_interval": 0.5,
    },
    result_expires=600,
)
_records = redis.Redis.from_url(
    env("BQ_RECORDS_URL") or env("BQ_BACKEND") or "redis://127.0.0.1:6379/1",
    **({"ssl_cert_reqs": "required", "ssl_ca_certs": env("BQ_CA")} if env("BQ_CA") else {}),
)


@app.task
def record(tag: str, blob: str = "") -> int:
    """Record one run of ``tag``; returns the blob's length (the 20 MB task)."""
    _records.rpush(env("BQ_RECORDS", "records"), json.dumps({"tag": tag, "pid": os.getpid()}))
    return len(blob)
