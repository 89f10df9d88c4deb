"""The ACL users of docs/acl.md, created on a redis-server of our own: the core (with every
optional feature on: history, events, functions and scripts, wait_replicas), a real
``celery worker`` and a real ``rq worker`` run as them (publish, claim, ack, recovery by
the sweep) with no refusal in ``ACL LOG``; the users really are restricted; and a command
the ACL refuses inside a transition changes nothing (Redis 7.0+)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import rq
from rq.job import JobStatus

import belayq_rq
from belayq import ConnectionLost, NotPermitted, ReliableQueue
from belayq.claim_any import claim_any
from belayq.embedded import RedisServer
from belayq.keeper import KEEPER
from tests.badinput.helpers import ROOT, CeleryWorker, celery_app, kombu_core, start_server
from tests.conftest import client_of
from tests.plugins.rq import jobs
from tests.plugins.rq.conftest import Workers
from tests.support import key_picture, wait_for

PASSWORD = "acl-test-pw"


def documented_users() -> dict[str, list[str]]:
    """User name -> the rule tokens of each ``ACL SETUSER`` block in docs/acl.md."""
    text = (ROOT / "docs" / "acl.md").read_text()
    users = {}
    for block in re.findall(r"```\n(ACL SETUSER .*?)```", text, re.S):
        tokens = block.split()[2:]
        users[tokens[0]] = [PASSWORD.join(t.split("CHANGE-ME")) for t in tokens[1:]]
    return users


FUNCTION_RULES = ("+fcall", "+function|load")
SHARDED_RULES = ("+spublish", "+ssubscribe", "+sunsubscribe")


def for_server(admin: redis.Redis, rules: list[str]) -> list[str]:
    """The rules as docs/acl.md says to use them on this server (6.2: no function rules,
    no sharded pub/sub)."""
    if int(str(admin.info("server")["redis_version"]).split(".")[0]) >= 7:
        return rules
    return [r for r in rules if r not in FUNCTION_RULES + SHARDED_RULES]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = start_server()
    admin = redis.Redis(port=s.port)
    for user, rules in documented_users().items():
        admin.execute_command("ACL", "SETUSER", user, *for_server(admin, rules))
    admin.close()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def replica(server: RedisServer) -> Iterator[RedisServer]:
    """A replica of ``server`` (so that ``wait_replicas=1`` is confirmed)."""
    s = start_server(["--replicaof", "127.0.0.1", str(server.port)])
    with client_of(s) as c:
        wait_for(lambda: c.info("replication").get("master_link_status") == "up", 30,
                 "the replica to sync")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    with client_of(server) as c:
        yield c


def as_user(server: RedisServer, user: str, db: int = 0) -> redis.Redis:
    return redis.Redis(port=server.port, username=user, password=PASSWORD, db=db)


def fresh_log(admin: redis.Redis) -> None:
    admin.acl_log_reset()


def refusals(admin: redis.Redis, user: str) -> list[dict[str, object]]:
    return [e for e in admin.acl_log() if e.get("username") == user]


def test_docs_define_the_three_users() -> None:
    assert set(documented_users()) == {"belayq-core", "belayq-celery", "belayq-rq"}


def test_the_core_runs_as_its_acl_user(server: RedisServer, admin: redis.Redis) -> None:
    fresh_log(admin)
    admin.config_resetstat()
    c = as_user(server, "belayq-core")
    q = ReliableQueue(c, "acl-core", lease_ms=300, keeper=False)
    other = ReliableQueue(c, "acl-core-2", keeper=False)
    q.publish(b"a")
    q.publish(b"later", delay_ms=50)
    assert [m.payload for m in q.delayed_messages(10)] == [b"later"]
    assert q.lead() and q.leads() and q.resign() and q.leader() is None
    d = q.claim(1)[0]
    assert q.extend([d]) == [True] and q.ack(d)
    time.sleep(0.06)
    d = q.claim(1)[0]
    assert q.nack(d, reason="retry") == "ready"
    d = q.claim(1)[0]
    assert q.dead_letter(d, "malformed")
    assert [x.reason for x in q.dead_letters()] == ["malformed"]
    assert q.replay_dead() == 1
    lost = q.claim(1)[0]  # never settled: the sweep brings it back after the lease
    time.sleep(0.4)
    assert q.sweep().reclaimed == 1
    again = q.claim(1)[0]
    assert again.id == lost.id and again.deliveries == lost.deliveries + 1 and q.ack(again)
    other.publish(b"b")
    got = claim_any([q, other], timeout=1)  # blocks on both, unblocks the other
    assert [x.payload for x in got] == [b"b"] and other.ack(got[0])
    assert q.stats()["in_flight"] == 0 and q.purge() == 0
    assert refusals(admin, "belayq-core") == []
    used = "cmdstat_fcall" if for_server(admin, list(FUNCTION_RULES)) else "cmdstat_evalsha"
    assert admin.info("commandstats")[used]["calls"] > 0
    c.close()


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "scripts"])
def test_the_core_runs_every_feature_as_its_acl_user(
    server: RedisServer, replica: RedisServer, admin: redis.Redis, functions: bool
) -> None:
    """The documented core user with the history, events, wait_replicas and FCALL (or
    EVALSHA) all on: every transition runs, and Redis logs no refusal."""
    seven = bool(for_server(admin, list(FUNCTION_RULES)))
    if functions and not seven:
        pytest.skip("Redis 6.2 has no functions")
    fresh_log(admin)
    c = as_user(server, "belayq-core")
    name = f"acl-all-{functions}"
    q = ReliableQueue(c, name, lease_ms=300, keeper=False, history_max=5, events=True,
                      wait_replicas=1, wait_timeout_ms=5_000, lua_functions=functions)
    with q.events() as stream:
        q.publish(b"a")
        q.publish(b"later", delay_ms=50)
        d = q.claim(1)[0]
        assert q.extend([d]) == [True] and q.ack(d, "done")
        time.sleep(0.06)
        d = q.claim(1)[0]
        assert q.nack(d, reason="retry") == "ready"
        d = q.claim(1)[0]
        assert q.dead_letter(d, "malformed")
        assert q.replay_dead() == 1
        lost = q.claim(1)[0]
        time.sleep(0.4)
        assert q.sweep().reclaimed == 1
        again = q.claim(1)[0]
        assert again.id == lost.id and q.ack(again)
        q.publish(b"b")
        [d] = q.claim(1)
        assert q.release([d]) == 1 and q.defer([(q.claim(1)[0], 0)]) == 1
        assert q.purge() == 1 and q.stats()["in_flight"] == 0
        assert q.pause() and q.claim(0) == [] and q.resume()
        assert len(q.consumers()) == 1  # this process registered its host and pid
        events = []
        while (event := stream.get(timeout=0.5)) is not None:
            events.append(event.kind)
    assert {"completed", "failed", "dead_lettered", "reclaimed", "paused",
            "resumed"} <= set(events), events
    assert [h.result for h in q.history("done")] == ["", "done"]
    assert [h.outcome for h in q.history("control")] == ["resumed", "paused"]
    assert [h.reason for h in q.history("failed")] == ["malformed"]
    assert refusals(admin, "belayq-core") == []
    used = admin.info("commandstats")
    assert used["cmdstat_fcall" if functions else "cmdstat_evalsha"]["calls"] > 0
    assert used["cmdstat_wait"]["calls"] > 0
    assert used["cmdstat_spublish" if seven else "cmdstat_publish"]["calls"] > 0
    q.drop()
    c.close()


def minus(admin: redis.Redis, user: str, dropped: tuple[str, ...]) -> str:
    """A copy of the documented core user without the ``dropped`` rules; its name."""
    rules = for_server(admin, documented_users()["belayq-core"])
    admin.execute_command("ACL", "SETUSER", user, "reset",
                          *[r for r in rules if r not in dropped])
    return user


def seven_or_skip(admin: redis.Redis) -> None:
    if not for_server(admin, list(FUNCTION_RULES)):
        pytest.skip("Redis 6.2 has no redis.acl_check_cmd: a refusal there is a documented limit")


def snapshot(q: ReliableQueue, admin: redis.Redis) -> dict[str, object]:
    return {k: key_picture(admin, k) for k in q.keys.all_keys()}


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "scripts"])
def test_an_ack_the_acl_refuses_for_the_history_writes_nothing(
    server: RedisServer, admin: redis.Redis, functions: bool
) -> None:
    """A user without +pexpire and a queue with a history: the ack is refused whole
    (NotPermitted naming PEXPIRE and the rule), no history entry is written, and the claim
    is still held; granted the rule, the same ack goes through."""
    seven_or_skip(admin)
    user = minus(admin, "belayq-core-no-pexpire", ("+pexpire",))
    c = redis.Redis(port=server.port, username=user, password=PASSWORD)
    name = f"acl-nopexpire-{functions}"
    q = ReliableQueue(c, name, history_max=5, keeper=False, lua_functions=functions)
    full = as_user(server, "belayq-core")
    claimer = ReliableQueue(full, name, history_max=5, keeper=False, lua_functions=functions)
    claimer.publish(b"a")
    [d] = claimer.claim(timeout=0)  # a claim may dead-letter (history): it needs +pexpire too
    claimer.forget([d])
    for _ in range(4):
        before = snapshot(q, admin)
        with pytest.raises(NotPermitted, match=r"PEXPIRE.*add \+pexpire"):
            q.ack(d)
        assert snapshot(q, admin) == before
    assert q.history("done") == [] and q.stats()["in_flight"] == 1
    admin.execute_command("ACL", "SETUSER", user, "+pexpire")
    assert q.ack(d) and [h.id for h in q.history("done")] == [d.id]
    q.drop()
    c.close()
    full.close()


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "scripts"])
def test_a_claim_the_acl_refuses_for_an_event_moves_nothing(
    server: RedisServer, admin: redis.Redis, functions: bool
) -> None:
    """A user without +spublish and a queue with events: a claim whose sweep would put an
    expired lease back (a 'reclaimed' event) is refused whole, naming the command and the
    channel; nothing moved."""
    seven_or_skip(admin)
    user = minus(admin, "belayq-core-no-publish", ("+spublish", "+publish"))
    c = redis.Redis(port=server.port, username=user, password=PASSWORD)
    name = f"acl-nopublish-{functions}"
    q = ReliableQueue(c, name, lease_ms=100, events=True, keeper=False,
                      lua_functions=functions)
    full = as_user(server, "belayq-core")
    claimer = ReliableQueue(full, name, lease_ms=100, events=True, keeper=False,
                            lua_functions=functions)
    q.publish(b"a")
    q.publish(b"b")
    claimer.forget(claimer.claim(timeout=0))  # every claim may publish: it needs +spublish
    time.sleep(0.15)  # the lease expires: the next claim's sweep reclaims it
    before = snapshot(q, admin)
    with pytest.raises(NotPermitted, match=r"SPUBLISH on channel .*events.*&"):
        q.claim(timeout=0)
    assert snapshot(q, admin) == before
    assert q.stats()["in_flight"] == 1 and q.stats()["ready"] == 1
    c.close()
    full.close()


@pytest.mark.parametrize("dropped", [FUNCTION_RULES, ("+function|load",)],
                         ids=["no-functions", "no-function-load"])
def test_without_function_rights_the_core_runs_its_scripts(
    server: RedisServer, admin: redis.Redis, dropped: tuple[str, ...]
) -> None:
    """The core user minus ``+fcall +function|load`` (or minus ``+function|load`` on a server
    whose library is gone): the first call is refused once, and the queue runs every call
    as a script instead."""
    if not for_server(admin, list(FUNCTION_RULES)):
        pytest.skip("Redis 6.2 has no functions: the core always runs scripts there")
    rules = documented_users()["belayq-core"]
    user = "belayq-core-" + "-".join(d.strip("+").replace("|", "-") for d in dropped)
    admin.execute_command("ACL", "SETUSER", user, *[r for r in rules if r not in dropped])
    admin.function_flush()
    fresh_log(admin)
    admin.config_resetstat()
    c = redis.Redis(port=server.port, username=user, password=PASSWORD)
    q = ReliableQueue(c, f"acl-{user}", keeper=False)
    q.publish(b"a")
    [d] = q.claim(1)
    assert q.ack(d) and q.stats()["in_flight"] == 0
    calls = admin.info("commandstats")
    fcall = calls.get("cmdstat_fcall", {"calls": 0, "failed_calls": 0})
    assert fcall["calls"] - fcall["failed_calls"] == 0, fcall  # none ran
    assert calls["cmdstat_evalsha"]["calls"] >= 3
    refused = [str(e.get("object")) for e in refusals(admin, user)]
    assert refused == (["fcall"] if "+fcall" in dropped else ["function|load"]), refused
    c.close()


@pytest.mark.parametrize("command", [("FLUSHALL",), ("CONFIG", "GET", "*"), ("KEYS", "*"),
                                     ("SET", "not-belayq", "1"), ("GET", "outside:key"),
                                     ("ACL", "LIST")])
def test_the_acl_users_are_really_restricted(server: RedisServer, command: tuple[str, ...]):
    for user in documented_users():
        c = as_user(server, user)
        with pytest.raises(redis.exceptions.NoPermissionError):
            c.execute_command(*command)
        c.close()


def test_a_queue_outside_the_patterns_is_refused(server: RedisServer) -> None:
    c = as_user(server, "belayq-core")
    with pytest.raises((NotPermitted, ConnectionLost)):
        ReliableQueue(c, "q", prefix="other", keeper=False)
    c.close()


def test_a_celery_worker_runs_as_its_acl_user(
    server: RedisServer, admin: redis.Redis, tmp_path: Path
) -> None:
    fresh_log(admin)
    user = f"belayq-celery:{PASSWORD}@127.0.0.1:{server.port}"
    env = {"BQ_BROKER": f"belayq://{user}/0", "BQ_BACKEND": f"redis://{user}/1",
           "BQ_QUEUE": "celery", "BQ_LEASE": "1", "BQ_RECORDS": "records",
           "BQ_RECORDS_URL": f"redis://127.0.0.1:{server.port}/1"}
    app = celery_app(env)
    # A claim whose holder vanished (lease 500 ms, never acked): the worker's sweep, as the
    # ACL user, puts it back and the worker runs it.
    lost = app.record.delay("lost")
    core = kombu_core(as_user(server, "belayq-celery"), "celery", lease_ms=500)
    core.forget(core.try_claim(1)[0])
    w = CeleryWorker(tmp_path / "worker.log", "--pool=prefork", "-c", "1", "-E", **env)
    try:
        w.wait_ready()
        assert [app.record.delay(f"t{i}").get(timeout=30) for i in range(3)] == [0, 0, 0]
        assert lost.get(timeout=30) == 0
        assert app.app.control.ping(timeout=5), "no pong over pub/sub fanout"
        assert w.alive()
    finally:
        w.stop()
    assert refusals(admin, "belayq-celery") == [], refusals(admin, "belayq-celery")


def test_an_rq_worker_runs_as_its_acl_user(
    server: RedisServer, admin: redis.Redis, tmp_path: Path
) -> None:
    fresh_log(admin)
    url = f"redis://belayq-rq:{PASSWORD}@127.0.0.1:{server.port}/0"
    c = as_user(server, "belayq-rq")
    ws = Workers(url, tmp_path)
    try:
        queue = rq.Queue("aclq", connection=c)
        # A job claimed by a "worker" that then vanished (lease 300 ms, never acked).
        lost = queue.enqueue(jobs.add, 2, 2)
        core = belayq_rq.Queue("aclq", connection=c, lease_ms=300).belayq()
        assert core.try_claim(1)[0][0].id == lost.id
        core.forget(core.held)
        proc = ws.start("aclq", worker_class="belayq_rq.Worker")
        done = [queue.enqueue(jobs.add, i, 1) for i in range(3)]
        wait_for(lambda: all(j.get_status() == JobStatus.FINISHED for j in [*done, lost]), 60,
                 "the jobs, and the lost one after the sweep")
        assert [j.return_value() for j in done] == [1, 2, 3] and lost.return_value() == 4
        assert proc.poll() is None
    finally:
        ws.stop_all()
        KEEPER.stop_all()  # the lost claim's queue must not sweep a stopped server
        c.close()
    assert refusals(admin, "belayq-rq") == [], refusals(admin, "belayq-rq")


def test_tracing_as_the_core_user_needs_no_rule_of_its_own(
    server: RedisServer, admin: redis.Redis
) -> None:
    """The context rides in the queue's meta hash (docs/acl.md): the core's rules alone
    publish it and read it back, so the receive links to its send."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from belayq.otel import BelayqInstrumentor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rules = for_server(admin, documented_users()["belayq-core"])
    BelayqInstrumentor().instrument(tracer_provider=provider)
    try:
        for linked in (True,):
            admin.execute_command("ACL", "SETUSER", "belayq-traced", "reset", *rules)
            c = redis.Redis(port=server.port, username="belayq-traced", password=PASSWORD)
            q = ReliableQueue(c, f"acl-traced-{linked}", keeper=False)
            exporter.clear()
            q.publish(b"x")
            [d] = q.claim(timeout=0)
            assert q.ack(d)
            names = [s.name for s in exporter.get_finished_spans()]
            assert names == [f"send {q.name}", f"receive {q.name}", f"settle {q.name}"]
            [receive] = [s for s in exporter.get_finished_spans() if s.kind.name == "CLIENT"
                         and s.name.startswith("receive")]
            assert bool(receive.links) is linked
            assert q.stats()["in_flight"] == 0 and q.stats()["acked"] == 1
            c.close()
    finally:
        BelayqInstrumentor().uninstrument()
        admin.execute_command("ACL", "DELUSER", "belayq-traced")
