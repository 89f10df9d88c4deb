"""Run Dramatiq's own Redis broker tests with belayq_dramatiq.Broker swapped in.

    python tests/plugins/dramatiq/peer/run_dramatiq_suite.py [--stock] [--on-redis] [args...]
    python tests/plugins/dramatiq/peer/run_dramatiq_suite.py --all [--stock]
    python tests/plugins/dramatiq/peer/run_dramatiq_suite.py --compare

1. Downloads the sdist of the installed dramatiq from PyPI (``pip download --no-deps
   --no-binary :all:``) into ``.peer/`` (git-ignored; never committed) and unpacks its
   ``tests/``; the unpacked ``dramatiq/`` package is removed (the installed one is tested).
   The sdist ships the tests without their ``conftest.py`` and ``common.py``: the fixtures
   come from ``harness/`` (``redis_broker`` is ours, or stock ``RedisBroker`` with
   ``--stock``).
2. Dramatiq's tests hard-code Redis on localhost:6379: the suite runs in a private network
   and PID namespace (``unshare -rnpf``) with a redis-server of our own on 6379 there.
3. Runs ``tests/test_redis.py`` (every test of the sdist that takes the Redis broker), or
   with ``--on-redis`` the tests written for StubBroker (actors, middleware, composition,
   results, worker) on the Redis broker (``ON_REDIS_TARGETS``); ``--all`` runs both.
   Prints the counts and every failure with its reason (``EXPECTED`` below, or
   "UNEXPECTED"), writes ``.peer/dramatiq-<version>-<mode>-results.json``, and exits 0
   only when every failure is an expected one (with ``--stock``: the baseline, whose
   failures are all listed as they are). ``--compare`` runs all four (stock and belayq,
   both sets of tests) and ends with the counts side by side.
4. With ``BELAYQ_DRAMATIQ_SHARDS=N`` the swapped-in broker has ``shards=N`` (belayq's own
   keys); the one further failure expected then is listed in ``EXPECTED_SHARDED``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
CACHE = ROOT / ".peer"
TARGETS = ["tests/test_redis.py"]
#: With --on-redis: the tests written for StubBroker that a Redis broker can run (not
#: test_stub_broker.py, which tests StubBroker itself; not test_broker.py, which imports
#: the RabbitMQ broker (pika) at the top; not the CLI and watcher tests, which take no
#: broker fixture).
ON_REDIS_TARGETS = [
    "tests/test_actors.py", "tests/test_callbacks.py",
    "tests/test_composition.py", "tests/test_generic_actors.py", "tests/test_messages.py",
    "tests/test_results.py", "tests/test_worker.py",
]


def version() -> str:
    return metadata.version("dramatiq")


def version_tuple() -> tuple[int, ...]:
    return tuple(int(part) for part in version().split(".")[:2])


_T = "tests/test_redis.py::"
_STOCK_API = "calls stock RedisBroker's Lua dispatcher (do_enqueue/do_fetch/do_qsize) or "
EXPECTED: dict[str, str] = {
    _T + "test_redis_unacked_messages_can_be_requeued": (
        _STOCK_API + "reads its per-worker ack sets and forces its maintenance pass, which "
        "belayq replaces with leases and the sweep; equivalent: test_workers.py::"
        "test_kill_9_mid_task_every_message_finishes_within_the_lease"
    ),
    _T + "test_redis_messages_can_be_dead_lettered": (
        "reads stock's dead-letter zset <queue>.XQ; belayq dead-letters into the core's "
        "dead set with the reason; equivalent: test_broker.py::"
        "test_nack_dead_letters_with_the_reason"
    ),
    _T + "test_redis_dead_lettered_messages_are_cleaned_up": (
        _STOCK_API + "forces stock's maintenance to expire <queue>.XQ; belayq caps its dead "
        "set (dead_letter_max) instead"
    ),
    _T + "test_redis_messages_belonging_to_missing_actors_are_rejected": (
        "reads <queue>.XQ; belayq dead-letters into the core's dead set; equivalent: "
        "test_broker.py::test_unknown_actor_is_dead_lettered_with_the_reason"
    ),
    _T + "test_redis_requeues_unhandled_delay_messages_on_shutdown": (
        "expects a delayed message on the stock .DQ list after shutdown; belayq keeps it in "
        "Redis's delayed set from the start, never in a worker; equivalent: test_workers.py"
        "::test_eta_waits_in_redis_across_a_worker_restart"
    ),
    _T + "test_redis_consumer_ack_can_retry_on_connection_error": (
        "patches stock's broker.do_ack, which belayq's consumer does not call"
    ),
    _T + "test_redis_consumer_nack_can_retry_on_connection_error": (
        "patches stock's broker.do_nack, which belayq's consumer does not call"
    ),
    _T + "test_redis_join_race_condition": _STOCK_API + "counts with its do_qsize",
}

_A = "tests/test_actors.py::"
_STUB_ONLY = "fails with stock RedisBroker too (measured in the same way): "
#: With --on-redis: the StubBroker tests that a Redis broker fails, stock or belayq.
EXPECTED_ON_REDIS: dict[str, str] = {
    _A + "test_actors_can_be_sent_messages": (
        _STUB_ONLY + "reads StubBroker's queue objects (broker.queues[name]; a Redis broker's "
        "queues is a set of names)"
    ),
    _A + "test_worker_handles_non_numeric_eta_and_logs_warning": (
        _STUB_ONLY + "puts a message straight on StubBroker's queue object (broker.queues[name])"
    ),
    _A + "test_worker_handles_none_eta": _STUB_ONLY + "same, with eta None",
    _A + "test_messages_belonging_to_missing_actors_are_rejected": (
        _STUB_ONLY + "compares the dead letter with the Message it sent, which a Redis broker "
        "copies with its redis_message_id"
    ),
    "tests/test_worker.py::test_exception_from_actor_doesnt_leak": (
        _STUB_ONLY + "the harness keeps a dead-lettered message's exception for join("
        "fail_fast=True), as StubBroker's proxies do; the test lets go of StubBroker's alone"
    ),
}

#: Tests written for StubBroker that race a Redis broker's consumer thread: they pass or
#: fail with the machine's load, and a failure is reported as expected.
RACES_ON_REDIS: dict[str, str] = {
    "tests/test_worker.py::test_workers_process_messages_in_order": (
        "counts the messages in the worker's in-memory work queue right after sending 5, "
        "before a Redis broker's consumer thread may have fetched them all: stock "
        "RedisBroker fails it every time (it polls with a backoff); belayq's blocking claim "
        "has them all in time on an idle machine, not always on a loaded one"
    ),
}

#: The tests as older sdists ship them, whose failures later sdists changed away.
if version_tuple() < (2, 2):
    EXPECTED_ON_REDIS[_A + "test_actors_can_prioritize_work"] = (
        _STUB_ONLY + "sends 10 low- and 10 high-priority messages to a paused one-thread "
        "worker, expecting every high one first: StubBroker hands the worker all 20, a Redis "
        "broker 2 at a time (the worker's prefetch), so priority orders only those 2; "
        "Dramatiq 2.2's test raises QUEUE_PREFETCH to 20 for this"
    )
if version_tuple() < (2, 0):
    EXPECTED[_T + "test_redis_broker_maintains_backwards_compat_with_old_acks"] = (
        _STOCK_API + "writes Dramatiq 1.x's old-style <queue>.acks zset and forces its "
        "maintenance pass to move them into its per-worker ack sets, which belayq replaces "
        "with leases (the test is gone from 2.0's sdist)"
    )

#: Expected failures not run with belayq swapped in: they would only wait for their timeout.
NOT_RUN = {
    _T + "test_redis_dead_lettered_messages_are_cleaned_up": (
        "sends 16,000 messages to dead-letter them, then forces stock's maintenance pass "
        "(redis_broker.do_qsize with maintenance_chance at 100 %), which belayq does not "
        "have: it fails on that call, after sending and running them for tens of seconds"
    ),
    _T + "test_redis_join_race_condition": (
        "its actor calls stock's do_qsize, which raises AttributeError with belayq; Retries "
        "then retries it 20 times with backoffs from 15 s, and join() waits for all of them"
    ),
}


def fetch_and_unpack() -> Path:
    sdist_dir = CACHE / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    name = f"dramatiq-{version()}.tar.gz"
    if not (sdist_dir / name).exists():
        args = ["download", "--no-deps", "--no-binary", ":all:", f"dramatiq=={version()}",
                "-d", str(sdist_dir)]
        for pip in ([sys.executable, "-m", "pip"], ["python3", "-m", "pip"],
                    [shutil.which("pip3") or "pip3"]):
            try:
                if subprocess.run([*pip, *args], capture_output=True, timeout=300).returncode == 0:
                    break
            except (OSError, subprocess.TimeoutExpired):
                continue
        else:
            raise SystemExit(f"could not download the dramatiq {version()} sdist")
    dest = CACHE / f"dramatiq-{version()}"
    if not (dest / "tests").is_dir():
        shutil.rmtree(dest, ignore_errors=True)
        with tarfile.open(sdist_dir / name) as tar:
            tar.extractall(CACHE, filter="data")
        shutil.rmtree(dest / "dramatiq", ignore_errors=True)
    for f in (HERE / "harness").glob("*.py"):
        shutil.copy(f, dest / "tests" / f.name)
    return dest


#: The swapped-in broker's ``shards`` (BELAYQ_DRAMATIQ_SHARDS, read by the harness): belayq's
#: own keys, where the tests that read stock's list by its name find nothing.
SHARDS = os.environ.get("BELAYQ_DRAMATIQ_SHARDS", "")
#: Further expected failures in belayq's own keys.
EXPECTED_SHARDED: dict[str, str] = {
    _T + "test_redis_requeues_unhandled_messages_on_shutdown": (
        "reads stock's list dramatiq:<queue> by its name; with shards the queue is in "
        "belayq's own keys; equivalent: test_broker.py::"
        "test_prefetched_messages_go_back_uncounted_on_close[shards3]"
    ),
}


def mode(stock: bool, on_redis: bool) -> str:
    own = f"-shards{SHARDS}" if SHARDS and not stock else ""
    return ("stock" if stock else "belayq") + own + ("-on-redis" if on_redis else "")


def junit_path(stock: bool, on_redis: bool) -> Path:
    return CACHE / f"dramatiq-{version()}-{mode(stock, on_redis)}-junit.xml"


def inside(src: Path, stock: bool, on_redis: bool, pytest_args: list[str]) -> int:
    """In the private namespace: our Redis on 6379, then pytest."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    from belayq.embedded import redis_server_binary, system_redis_server

    binary = system_redis_server() or redis_server_binary()
    workdir = CACHE / f"dramatiq-netns-redis-{mode(stock, on_redis)}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    server = subprocess.Popen(
        [binary, "--port", "6379", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", 6379), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.05)
        env = dict(os.environ)
        # Dramatiq's suite is the package `tests`: this repository's stays off the path.
        env["PYTHONPATH"] = ""
        env["BELAYQ_DRAMATIQ_SWAP"] = "0" if stock else "1"
        env["BELAYQ_DRAMATIQ_ON_REDIS"] = "1" if on_redis else "0"
        junit = junit_path(stock, on_redis)
        junit.unlink(missing_ok=True)
        skipped = [] if stock or on_redis else [a for n in NOT_RUN for a in ("--deselect", n)]
        targets = ON_REDIS_TARGETS if on_redis else TARGETS
        cmd = [sys.executable, "-m", "pytest", *targets, *skipped, "-q", "-p", "no:cacheprovider",
               "-o", "addopts=", "-o", "log_level=WARNING", "--timeout", "120",
               "--junitxml", str(junit), *pytest_args]
        return subprocess.run(cmd, cwd=src, env=env).returncode
    finally:
        server.terminate()
        server.wait(10)


def report(stock: bool, on_redis: bool, seconds: float) -> int:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures: dict[str, str] = {}
    for case in ET.parse(junit_path(stock, on_redis)).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        nodeid = f"{module}.py::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed"] += 1
            failures[nodeid] = (bad.get("message") or "").splitlines()[0][:300]
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    label = "stock RedisBroker" if stock else "belayq_dramatiq.Broker swapped in" + (
        f" (shards={SHARDS})" if SHARDS else "")
    tests = "StubBroker tests on a Redis broker" if on_redis else "Redis broker tests"
    print(f"\nDramatiq {version()} {tests}, {label}: {counts['passed']} passed, "
          f"{counts['failed']} failed, {counts['skipped']} skipped in {seconds:.0f} s")
    unexpected = []
    not_run = [] if stock or on_redis else list(NOT_RUN)
    expected = {**EXPECTED_ON_REDIS, **RACES_ON_REDIS} if on_redis else {**EXPECTED, **(
        EXPECTED_SHARDED if SHARDS else {})}
    for nodeid in not_run:
        print(f"  NOT RUN {nodeid}\n      expected to fail: {NOT_RUN[nodeid]}")
    for nodeid, message in failures.items():
        if nodeid in expected and (not stock or on_redis):
            tag = f"expected: {expected[nodeid]}"
        else:
            tag = f"UNEXPECTED: {message}"
            unexpected.append(nodeid)
        print(f"  FAILED {nodeid}\n      {tag}")
    result = {"dramatiq": version(), "mode": label, "seconds": round(seconds), **counts,
              "failures": failures, "not_run": not_run,
              "unexpected": unexpected}
    out = CACHE / f"dramatiq-{version()}-{mode(stock, on_redis)}-results.json"
    out.write_text(json.dumps(result, indent=2))
    return 1 if unexpected else 0


def compare(rest: list[str]) -> int:
    """Both sets of tests with stock RedisBroker and with belayq's Broker, one after the
    other; prints the counts side by side. Exit code: belayq's."""
    codes = [main([*rest, *flags]) for flags in ([], ["--on-redis"], ["--stock"],
                                                   ["--stock", "--on-redis"])]
    print(f"\nDramatiq {version()}: passed / failed / not run")
    for on_redis, label in ((False, "Redis broker tests"), (True, "StubBroker tests on Redis")):
        row = []
        for stock in (True, False):
            path = CACHE / f"dramatiq-{version()}-{mode(stock, on_redis)}-results.json"
            r = json.loads(path.read_text())
            row.append(f"{r['passed']} / {r['failed']} / {len(r.get('not_run', []))}")
        print(f"  {label:28} stock {row[0]:14} belayq {row[1]}")
    return max(codes[:2])


def main(argv: list[str]) -> int:
    if "--compare" in argv:
        return compare([a for a in argv if a != "--compare"])
    if "--all" in argv:
        rest = [a for a in argv if a != "--all"]
        return max(main(rest), main([*rest, "--on-redis"]))
    stock, on_redis = "--stock" in argv, "--on-redis" in argv
    rest = [a for a in argv if a not in ("--stock", "--on-redis", "--inside")]
    src = fetch_and_unpack()
    if "--inside" in argv:
        return inside(src, stock, on_redis, rest)
    if shutil.which("unshare") is None:
        raise SystemExit("needs `unshare` (util-linux) for a private network namespace")
    t0 = time.monotonic()
    inner = ["unshare", "-rnpf", "--mount-proc", sys.executable, __file__, "--inside", *argv]
    code = subprocess.run(inner).returncode
    if not junit_path(stock, on_redis).exists():
        raise SystemExit(f"the suite did not run (exit {code})")
    return report(stock, on_redis, time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
