"""Fixtures for Dramatiq's own tests (its sdist ships them without their conftest): the
Redis broker is belayq_dramatiq's when BELAYQ_DRAMATIQ_SWAP=1, else stock RedisBroker, on
the redis-server the runner started on 127.0.0.1:6379 inside its own network namespace.

With BELAYQ_DRAMATIQ_ON_REDIS=1 the tests written for StubBroker (actors, middleware,
composition, results...) run on that Redis broker too: ``stub_broker`` is the Redis broker
with the two test helpers of StubBroker they use (``dead_letters``, and ``join``'s
``fail_fast``, which raises the exception of a message dead-lettered during the join).
BELAYQ_DRAMATIQ_SHARDS=N gives the swapped-in broker ``shards=N`` (belayq's own keys).
"""

from __future__ import annotations

import collections
import os

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware
from dramatiq.results.backends import RedisBackend

SWAP = os.environ.get("BELAYQ_DRAMATIQ_SWAP") == "1"
ON_REDIS = os.environ.get("BELAYQ_DRAMATIQ_ON_REDIS") == "1"
#: With the swap, the broker's ``shards`` (belayq's own keys), when set.
SHARDS = os.environ.get("BELAYQ_DRAMATIQ_SHARDS", "")


class _Nacks(Middleware):
    """Keeps the messages a worker of this process dead-lettered, with their exceptions
    (taken before the worker clears them, as StubBroker's proxies keep theirs)."""

    def __init__(self, kept, errors):
        self.kept, self.errors = kept, errors

    def after_nack(self, broker, message):
        self.kept[message.queue_name].append(message)
        self.errors[id(message)] = message._exception


def with_stub_helpers(base):
    """``base`` with StubBroker's ``dead_letters`` and ``join(fail_fast=...)``."""

    class OnRedis(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.dead_letters_by_queue = collections.defaultdict(list)
            self._errors = {}
            self.add_middleware(_Nacks(self.dead_letters_by_queue, self._errors))
            # StubBroker's join fails fast by default from Dramatiq 2.0 on (its
            # fail_fast_default); 1.x's does not, and its tests are written for that.
            self.fail_fast_default = dramatiq.__version__.split(".")[0] != "1"

        @property
        def dead_letters(self):
            return [m for q in self.dead_letters_by_queue.values() for m in q]

        def join(self, queue_name, *, timeout=None, fail_fast=None):
            super().join(queue_name, timeout=timeout)
            if fail_fast is None:
                fail_fast = self.fail_fast_default
            for message in self.dead_letters_by_queue[queue_name] if fail_fast else ():
                error = self._errors.get(id(message))
                raise (error or Exception("Message failed with unknown error"))

    return OnRedis


def _redis_broker(stub_helpers=False):
    options = {}
    if SWAP:
        from belayq_dramatiq import Broker as base
        if SHARDS:
            options["shards"] = int(SHARDS)
    else:
        base = RedisBroker
    return (with_stub_helpers(base) if stub_helpers else base)(**options)


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
    if ON_REDIS:
        redis.Redis().flushall()
        broker = _redis_broker(stub_helpers=True)
        broker.emit_after("process_boot")
        dramatiq.set_broker(broker)
        yield broker
        broker.close()
        redis.Redis().flushall()
        return
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


@pytest.fixture
def redis_result_backend(result_backend):
    return result_backend


@pytest.fixture
def rate_limiter_backend():
    from dramatiq.rate_limits.backends import RedisBackend as RateLimiterBackend

    redis.Redis().flushall()
    return RateLimiterBackend()
