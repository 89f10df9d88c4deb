"""Fixtures for Dramatiq's own tests (its sdist ships them without their conftest): the
Redis broker is belayq_dramatiq's when BELAYQ_DRAMATIQ_SWAP=1, else stock RedisBroker, on
the redis-server the runner started on 127.0.0.1:6379 inside its own network namespace."""

from __future__ import annotations

import os

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.results.backends import RedisBackend

SWAP = os.environ.get("BELAYQ_DRAMATIQ_SWAP") == "1"


def _redis_broker() -> dramatiq.Broker:
    if SWAP:
        from belayq_dramatiq import Broker

        return Broker()
    return RedisBroker()


@pytest.fixture
def redis_broker():
    redis.Redis().flushall()
    broker = _redis_broker()
    dramatiq.set_broker(broker)
    yield broker
    broker.close()
    redis.Redis().flushall()


@pytest.fixture
def redis_worker(redis_broker):
    worker = Worker(redis_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def stub_broker():
    broker = StubBroker()
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture
def stub_worker(stub_broker):
    worker = Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def result_backend():
    redis.Redis().flushall()
    return RedisBackend()
