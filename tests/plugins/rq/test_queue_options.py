"""``belayq_rq.Queue``'s options: ``lease_ms``, ``max_deliveries`` and ``belayq_options``
(keywords or class attributes) reach the core queue; a misspelled keyword, an unknown
belayq option or a bad value is one clear error when the queue is built, and changes
nothing. The workers refuse misspelled keywords the same way."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import redis
import rq.serializers

import belayq_rq
from belayq import ConfigError
from tests.plugins.rq import jobs


def test_belayq_options_given_as_a_keyword_reach_the_core_queue(conn: redis.Redis) -> None:
    q = belayq_rq.Queue("q", connection=conn, lease_ms=5_000, max_deliveries=3,
                        belayq_options={"sweep_interval_ms": 500, "sweep_limit": 7})
    c = q.belayq().config
    assert (c.lease_ms, c.max_deliveries, c.sweep_interval_ms, c.sweep_limit) == (
        5_000, 3, 500, 7)


def test_a_keyword_belayq_options_adds_to_the_class_ones(conn: redis.Redis) -> None:
    class Mine(belayq_rq.Queue):
        belayq_options: ClassVar[dict[str, Any]] = {"sweep_interval_ms": 500, "sweep_limit": 7}

    c = Mine("q", connection=conn, belayq_options={"sweep_limit": 9}).belayq().config
    assert (c.sweep_interval_ms, c.sweep_limit) == (500, 9)


def test_rqs_own_keywords_still_work(conn: redis.Redis) -> None:
    q = belayq_rq.Queue("q", conn, default_timeout=30, is_async=True, job_class=rq.job.Job,
                        serializer=rq.serializers.JSONSerializer)
    assert q._default_timeout == 30 and q.serializer is not None
    assert q.enqueue(jobs.add, 1, 2).id in q.job_ids


@pytest.mark.parametrize("kwargs, named", [
    ({"lease_msec": 5_000}, "lease_msec"),
    ({"max_delivery": 3}, "max_delivery"),
    ({"belayq_option": {"sweep_limit": 7}}, "belayq_option"),
    ({"default_timout": 30}, "default_timout"),
])
def test_a_misspelled_keyword_is_a_type_error_naming_it(
    conn: redis.Redis, kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(TypeError, match=named):
        belayq_rq.Queue("q", connection=conn, **kwargs)


@pytest.mark.parametrize("kwargs, says", [
    ({"belayq_options": {"sweep_intervl_ms": 500}}, "sweep_intervl_ms"),
    ({"belayq_options": {"sweep_interval_ms": -1}}, "sweep_interval_ms"),
    ({"belayq_options": {"lease_ms": 5_000}}, "lease_ms"),
    ({"belayq_options": {"payload_in_list": False}}, "payload_in_list"),
    ({"belayq_options": {"claim_starts": False}}, "claim_starts"),
    ({"belayq_options": ["sweep_limit"]}, "mapping"),
    ({"lease_ms": 50}, "lease_ms"),
    ({"lease_ms": "20s"}, "lease_ms"),
    ({"max_deliveries": 0}, "max_deliveries"),
])
def test_a_bad_belayq_option_is_one_config_error(
    conn: redis.Redis, kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        belayq_rq.Queue("q", connection=conn, **kwargs)
    assert conn.keys("*") == []


def test_a_subclass_with_a_bad_class_option_fails_when_built(conn: redis.Redis) -> None:
    class Typo(belayq_rq.Queue):
        belayq_options: ClassVar[dict[str, Any]] = {"sweep_intervl_ms": 500}

    class NotAMapping(belayq_rq.Queue):
        belayq_options: ClassVar[Any] = ["sweep_limit"]

    with pytest.raises(ConfigError, match="sweep_intervl_ms"):
        Typo("q", connection=conn)
    with pytest.raises(ConfigError, match="mapping"):
        NotAMapping("q", connection=conn)


@pytest.mark.parametrize("worker", [belayq_rq.Worker, belayq_rq.SimpleWorker])
def test_a_worker_with_a_misspelled_keyword_is_a_type_error_naming_it(
    conn: redis.Redis, worker: type[Any]
) -> None:
    with pytest.raises(TypeError, match="job_monitoring_intervall"):
        worker(["q"], connection=conn, job_monitoring_intervall=5)
    with pytest.raises(TypeError, match="lease_ms"):
        worker(["q"], connection=conn, lease_ms=5_000)  # a queue's option, not a worker's
    assert conn.keys("*") == []
