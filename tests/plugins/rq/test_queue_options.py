"""``belayq_rq.Queue``'s options: ``lease_ms``, ``max_deliveries`` and ``belayq_options``
(keywords or class attributes) reach the core queue; a misspelled keyword, an unknown
belayq option or a bad value is one clear error when the queue is built, and changes
nothing. The workers refuse misspelled keywords the same way."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import redis
import rq
import rq.serializers

import belayq_rq
from belayq import ConfigError, UnknownOption
from belayq_rq.queue import IgnoredKeywordWarning
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


@pytest.mark.parametrize("kwargs, named, near", [
    ({"lease_msec": 5_000}, "lease_msec", "did you mean 'lease_ms'"),
    ({"max_delivery": 3}, "max_delivery", "did you mean 'max_deliveries'"),
    ({"belayq_option": {"sweep_limit": 7}}, "belayq_option", "did you mean 'belayq_options'"),
    ({"sweep_limit": 7}, "sweep_limit", r"pass it as belayq_options=\{'sweep_limit'"),
    ({"sweep_intervl_ms": 9}, "sweep_intervl_ms", r"belayq_options=\{'sweep_interval_ms'"),
])
def test_a_misspelled_belayq_option_is_refused_naming_it_and_the_valid_ones(
    conn: redis.Redis, kwargs: dict[str, Any], named: str, near: str
) -> None:
    with pytest.raises(UnknownOption, match=f"'{named}'; .*{near}") as raised:
        belayq_rq.Queue("q", connection=conn, **kwargs)
    assert "valid: belayq_options, lease_ms, max_deliveries" in str(raised.value)
    assert isinstance(raised.value, TypeError)  # Python's own error for a bad keyword
    assert conn.keys("*") == []


@pytest.mark.parametrize("kwargs", [
    {"result_ttl": -1}, {"result_ttl": 0}, {"failure_ttl": 10}, {"default_timout": 30},
])
def test_a_keyword_stock_rq_accepts_and_ignores_is_accepted_with_a_warning(
    conn: redis.Redis, kwargs: dict[str, Any]
) -> None:
    stock = rq.Queue("q", connection=conn, **kwargs)  # stock RQ accepts it, and ignores it
    with pytest.warns(IgnoredKeywordWarning, match=repr(next(iter(kwargs)))):
        q = belayq_rq.Queue("q", connection=conn, **kwargs)
    assert q._default_timeout == stock._default_timeout
    job = q.enqueue(jobs.add, 1, 2)
    assert job.id in q.job_ids
    assert belayq_rq.SimpleWorker([q], connection=conn).work(burst=True)
    assert job.get_status() == "finished" and job.return_value() == 3


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
