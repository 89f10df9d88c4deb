"""Priority claims: the verification steps of the priority-queue seed, against belayq.

1. Ordering: strict priority across levels, FIFO inside a level, and a blocked claim is
   woken (the bell) when work arrives only on a lower level.
2. Atomic pop: 50 concurrent consumers x 10,000 messages, each processed exactly once.
3. Crash recovery (kill -9) lives in another suite.
4. Bulk keeps moving: with a starvation floor the oldest bulk job's age plateaus under a
   continuous priority-0 load; without it bulk never runs while priority-0 work waits.

Timings are printed, never asserted: other suites share this 2-core machine.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

from belayq import ReliableQueue

STEPS3 = (0, 1, 2)


def _backend(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params.get("any_client", "?"))


def _claim_one(q: ReliableQueue) -> Any:
    got = q.claim(timeout=0)
    assert len(got) == 1, f"expected one waiting message, got {got!r}"
    return got[0]


# -- 1. ordering ---------------------------------------------------------------------------


def test_verification_1_priority_then_publish_order(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS3)
    p2 = q.publish(b"p2", priority=2)
    p0a = q.publish(b"p0-a", priority=0)
    p1 = q.publish(b"p1", priority=1)
    p0b = q.publish(b"p0-b", priority=0)
    assert q.stats()["ready"] == 4

    order = []
    for _ in range(4):
        d = _claim_one(q)
        order.append(d.id)
        assert q.ack(d)
    assert order == [p0a, p0b, p1, p2]
    assert q.claim(timeout=0) == []
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["leased"], s["acked"]) == (0, 0, 0, 4)


def test_verification_1_one_batch_claim_keeps_the_order(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS3)
    plan = ((b"p2", 2), (b"p0a", 0), (b"p1", 1), (b"p0b", 0))
    ids = [q.publish(p, priority=pr) for p, pr in plan]
    got = q.claim(timeout=0, count=10)
    assert [d.id for d in got] == [ids[1], ids[3], ids[2], ids[0]]
    assert all(q.ack_many(got))


def test_fifo_within_a_priority_over_many_messages(any_client, make_queue):
    q = make_queue(any_client, priority_steps=STEPS3)
    expected: dict[int, list[str]] = {0: [], 1: [], 2: []}
    # Interleave the levels, single publishes and pipelined batches.
    for round_ in range(20):
        for prio in (2, 0, 1):
            if round_ % 2:
                payloads = [f"{prio}-{round_}-{k}" for k in range(10)]
                expected[prio] += q.publish_many(payloads, priority=prio)
            else:
                for k in range(10):
                    expected[prio].append(q.publish(f"{prio}-{round_}-{k}", priority=prio))
    total = sum(len(v) for v in expected.values())
    assert total == 600 and q.stats()["ready"] == total

    claimed: list[str] = []
    counts = (1, 3, 10, 7, 1, 25)
    i = 0
    while True:
        got = q.claim(timeout=0, count=counts[i % len(counts)])
        i += 1
        if not got:
            break
        claimed += [d.id for d in got]
        assert all(q.ack_many(got))
    assert claimed == expected[0] + expected[1] + expected[2]
    assert q.stats()["acked"] == total


def test_blocked_claim_is_woken_by_a_lower_priority_publish(any_client, make_queue, request):
    """The bell: a claimer blocked on the level-1 list must wake when a message arrives
    only on a lower level (priority 2 here), and get that message."""
    q = make_queue(any_client, priority_steps=STEPS3)
    result: dict[str, Any] = {}
    started = threading.Event()

    def blocked_claimer() -> None:
        started.set()
        t0 = time.monotonic()
        try:
            result["got"] = q.claim(timeout=2)
        except BaseException as exc:  # surfaced by the assertion below
            result["error"] = exc
        result["waited"] = time.monotonic() - t0

    thread = threading.Thread(target=blocked_claimer, daemon=True)
    thread.start()
    started.wait(5)
    time.sleep(0.3)  # let it reach BLMOVE on the empty queue
    t_pub = time.monotonic()
    msg_id = q.publish(b"bulk", priority=2)
    thread.join(10)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    latency = time.monotonic() - t_pub
    print(
        f"\n[{_backend(request)}] bell: claim returned {latency * 1000:.1f} ms after publish "
        f"(blocked {result['waited']:.2f} s in total, timeout 2 s)"
    )
    got = result["got"]
    assert [(d.id, d.payload) for d in got] == [(msg_id, b"bulk")]
    assert q.ack(got[0])
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["leased"]) == (0, 0, 0)


def test_the_bell_wakes_every_blocked_claimer(any_client, make_queue, request):
    """Three blocked claimers, three priority-1 messages in one pipeline: each claimer gets
    one (the bell is re-rung after each claim while lower levels still hold work)."""
    q = make_queue(any_client, priority_steps=STEPS3)
    results: list[list[Any]] = []
    lock = threading.Lock()

    def claimer() -> None:
        got = q.claim(timeout=3)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=claimer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.4)
    t_pub = time.monotonic()
    ids = q.publish_many([b"a", b"b", b"c"], priority=1)
    for t in threads:
        t.join(10)
    print(
        f"\n[{_backend(request)}] bell x3: all claimers back "
        f"{(time.monotonic() - t_pub) * 1000:.1f} ms after publish"
    )
    got = [d for batch in results for d in batch]
    assert sorted(d.id for d in got) == sorted(ids)
    assert all(len(batch) == 1 for batch in results)
    assert all(q.ack_many(got))


# -- 2. the pop is atomic: N consumers, every message exactly once -------------------------


def _run_consumers(
    new_client: Callable[[], Any],
    name: str,
    n_msgs: int,
    n_consumers: int,
    *,
    batch: int = 250,
    deadline_s: float = 150.0,
) -> dict[str, Any]:
    """Publish ``n_msgs`` (in pipelined batches) and consume them with ``n_consumers``
    threads, each with its own client and queue object. Every fifth consumer claims up to
    10 at a time, the others one."""
    lease_ms = 120_000  # no lease may expire during the run: a redelivery is not a bug here
    prod_client = new_client()
    producer = ReliableQueue(prod_client, name, keeper=False, lease_ms=lease_ms)
    seen: list[list[bytes]] = [[] for _ in range(n_consumers)]
    ack_ok = [0] * n_consumers
    ack_refused = [0] * n_consumers
    processed = [0]
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    ready = threading.Barrier(n_consumers + 1)

    def consume(k: int) -> None:
        try:
            client = new_client()
            q = ReliableQueue(client, name, lease_ms=lease_ms)  # with the lease keeper
        except BaseException as exc:
            errors.append(exc)
            ready.abort()  # fail the run at once instead of waiting out the barrier
            return
        count = 10 if k % 5 == 0 else 1
        try:
            ready.wait(60)
            while not stop.is_set():
                got = q.claim(timeout=0.5, count=count)
                if not got:
                    continue
                seen[k].extend(d.payload for d in got)
                oks = [q.ack(got[0])] if count == 1 else q.ack_many(got)
                ack_ok[k] += sum(oks)
                ack_refused[k] += len(oks) - sum(oks)
                with lock:
                    processed[0] += len(got)
                    if processed[0] >= n_msgs:
                        stop.set()
        except BaseException as exc:
            errors.append(exc)
            stop.set()
        finally:
            q.close(release=True)
            client.close()

    threads = [threading.Thread(target=consume, args=(k,), daemon=True) for k in range(n_consumers)]
    published: list[str] = []

    def publish_range(lo: int, hi: int) -> None:
        for start in range(lo, hi, batch):
            payloads = [f"m-{i}" for i in range(start, min(hi, start + batch))]
            published.extend(producer.publish_many(payloads))

    # Half is a backlog before anyone claims (the in-script LMOVE path, batches of 10), half
    # arrives while consumers wait (the BLMOVE + lease.lua path).
    publish_range(0, n_msgs // 2)
    t0 = time.monotonic()
    for t in threads:
        t.start()
    ready.wait(60)
    publish_range(n_msgs // 2, n_msgs)
    t_published = time.monotonic() - t0
    stop.wait(deadline_s)
    stop.set()
    for t in threads:
        t.join(15)
    elapsed = time.monotonic() - t0
    stats = producer.stats()
    prod_client.close()
    return {
        "errors": errors,
        "alive": [t.name for t in threads if t.is_alive()],
        "seen": seen,
        "ack_ok": sum(ack_ok),
        "ack_refused": sum(ack_refused),
        "published": published,
        "stats": stats,
        "elapsed": elapsed,
        "t_published": t_published,
    }


def _check_exactly_once(out: dict[str, Any], n_msgs: int, label: str) -> None:
    assert not out["errors"], out["errors"][:3]
    assert not out["alive"], f"consumers still running: {out['alive'][:5]}"
    assert len(set(out["published"])) == n_msgs
    everything = [p for per in out["seen"] for p in per]
    dupes = [p for p, c in Counter(everything).items() if c > 1]
    missing = {f"m-{i}".encode() for i in range(n_msgs)} - set(everything)
    busy = sum(1 for per in out["seen"] if per)
    s = out["stats"]
    print(
        f"\n[{label}] {n_msgs} msgs, {len(out['seen'])} consumers ({busy} got work): "
        f"second half published after {out['t_published']:.1f} s, "
        f"all done in {out['elapsed']:.1f} s "
        f"({n_msgs / out['elapsed']:.0f} msg/s); stats={s}"
    )
    assert not dupes, f"{len(dupes)} processed twice, e.g. {dupes[:5]}"
    assert not missing, f"{len(missing)} never processed, e.g. {sorted(missing)[:5]}"
    assert len(everything) == n_msgs
    assert out["ack_ok"] == n_msgs and out["ack_refused"] == 0
    assert (s["ready"], s["in_flight"], s["leased"], s["delayed"], s["dead"]) == (0, 0, 0, 0, 0)
    assert s["acked"] == n_msgs
    assert s["claimed"] == n_msgs and s["published"] == n_msgs
    for counter in ("reclaimed", "adopted", "lost_claims", "duplicates_dropped"):
        assert s.get(counter, 0) == 0, (counter, s)
    # Not asserted: stats["stale_acks"] can be > 0 here although every ack succeeded; the
    # lease keeper's extend races the consumers' acks (see
    # test_heartbeat_racing_an_ack_is_not_a_stale_ack below).


@pytest.mark.slow
def test_verification_2_fifty_consumers_ten_thousand_messages(redis_server, qname):
    n_msgs, n_consumers = 10_000, 50

    def new_client() -> redis.Redis:
        return redis.Redis(port=redis_server.port)

    out = _run_consumers(new_client, qname, n_msgs, n_consumers)
    _check_exactly_once(out, n_msgs, "redis 50x10k")


def test_verification_2_small_variant_on_the_cluster(cluster_servers, qname):
    from redis.cluster import ClusterNode, RedisCluster

    n_msgs, n_consumers = 2_000, 8

    def new_client() -> RedisCluster:
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in cluster_servers.startup_nodes]
        )

    out = _run_consumers(new_client, qname, n_msgs, n_consumers, batch=200)
    _check_exactly_once(out, n_msgs, "cluster 8x2k")


# -- 4. bulk keeps moving ------------------------------------------------------------------

BULK = 9
FLOOR_STEPS = (0, BULK)


class _TopUp:
    """A producer thread that keeps the priority-0 level topped up (continuous load)."""

    def __init__(self, q: ReliableQueue, low: int = 600, chunk: int = 100) -> None:
        self.q, self.low, self.chunk = q, low, chunk
        self.stop = threading.Event()
        self.published = 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        level0 = self.q.keys.levels[0]
        try:
            while not self.stop.is_set():
                if self.q.client.llen(level0) < self.low:
                    self.q.publish_many([b"urgent"] * self.chunk, priority=0)
                    self.published += self.chunk
                else:
                    self.stop.wait(0.005)
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> _TopUp:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.errors, self.errors


def _floor_run(
    q: ReliableQueue, n_claims: int, bulk_every: int, initial_bulk: int
) -> dict[str, Any]:
    """Claim ``n_claims`` times under a continuous priority-0 load.

    The clock is logical: "age" is counted in claims. Bulk jobs are published at claim 0
    (``initial_bulk`` of them) and then one every ``bulk_every`` claims; each payload
    carries the claim index it was published at. Level 0 is prefilled with more urgent
    work than the run can drain, so it is never empty whatever the producer thread's
    scheduling; the producer tops it up as well.
    """
    q.publish_many([b"urgent"] * (n_claims + 200), priority=0)
    started = time.monotonic()
    waiting: list[int] = []  # publish index of each waiting bulk job, oldest first
    for _ in range(initial_bulk):
        q.publish(b"bulk:0", priority=BULK)
        waiting.append(0)
    bulk_served: list[tuple[int, int]] = []  # (claim index, age in claims)
    oldest_age: list[int] = []  # after every claim
    level0 = q.keys.levels[0]
    with _TopUp(q) as producer:
        for i in range(1, n_claims + 1):
            if bulk_every and i % bulk_every == 0:
                q.publish(f"bulk:{i}", priority=BULK)
                waiting.append(i)
            d = _claim_one(q)
            if d.payload.startswith(b"bulk:"):
                born = int(d.payload.split(b":")[1])
                assert born == waiting.pop(0), "bulk jobs must be served oldest first"
                bulk_served.append((i, i - born))
            else:
                assert d.payload == b"urgent"
            assert q.ack(d)
            oldest_age.append(i - waiting[0] if waiting else 0)
        level0_left = q.client.llen(level0)
    # The same age in real time, for the log only (never asserted).
    wall_age = round((time.monotonic() - started) * 1000) if waiting else None
    return {
        "bulk_served": bulk_served,
        "oldest_age": oldest_age,
        "waiting": waiting,
        "level0_left": level0_left,
        "topped_up": producer.published,
        "wall_age_ms": wall_age,
    }


def _window_peaks(ages: list[int], window: int) -> list[int]:
    return [max(ages[k : k + window]) for k in range(0, len(ages), window)]


def test_verification_4_floor_gives_bulk_about_a_tenth_of_claims(r, make_queue):
    """A bulk backlog larger than the floor can drain: exactly every 10th claim is bulk."""
    q = make_queue(r, priority_steps=FLOOR_STEPS, starvation_floor=0.1)
    n = 1000
    out = _floor_run(q, n, bulk_every=0, initial_bulk=300)
    served = len(out["bulk_served"])
    print(
        f"\nfloor 0.1, saturated bulk: {served}/{n} claims were bulk; producer added "
        f"{out['topped_up']}; level 0 still held {out['level0_left']}"
    )
    assert out["level0_left"] > 0  # priority-0 work was waiting the whole time
    assert 90 <= served <= 110
    # Spread out, not bunched: no gap of more than 2 x 10 claims between bulk claims.
    at = [i for i, _ in out["bulk_served"]]
    assert max(b - a for a, b in zip([0, *at[:-1]], at, strict=True)) <= 20


def test_verification_4_oldest_bulk_age_plateaus_with_the_floor(r, make_queue):
    """Bulk arrives at 1 per 15 claims, the floor serves 1 per 10: the oldest bulk job's
    age (in claims) stays bounded instead of growing with the run."""
    q = make_queue(r, priority_steps=FLOOR_STEPS, starvation_floor=0.1)
    n = 1500
    out = _floor_run(q, n, bulk_every=15, initial_bulk=10)
    window = 100
    peaks = _window_peaks(out["oldest_age"], window)
    published = 10 + n // 15
    print(
        f"\nfloor 0.1: peak age (in claims) of the oldest waiting bulk job per {window} "
        f"claims: {peaks}; {len(out['bulk_served'])}/{published} bulk served; still "
        f"waiting {len(out['waiting'])}; age of the run while bulk work waited waiting: "
        f"{out['wall_age_ms']} ms"
    )
    assert out["level0_left"] > 0
    # Plateau: once the initial backlog is drained (~300 claims), a bulk job waits at most
    # until the next floor claim (10 claims); the peak stops growing with the run.
    assert max(peaks[len(peaks) // 2 :]) <= 20, peaks
    assert max(peaks) <= 150, peaks
    assert max(peaks[-3:]) <= max(peaks[:3])
    assert max(age for _, age in out["bulk_served"][-20:]) <= 20
    assert len(out["waiting"]) <= 2
    assert len(out["bulk_served"]) >= published - 2


def test_verification_4_without_the_floor_bulk_starves(r, make_queue):
    """starvation_floor=0 is strict priority: no bulk claim while priority-0 work waits,
    and the oldest bulk job's age grows with every claim."""
    q = make_queue(r, priority_steps=FLOOR_STEPS, starvation_floor=0)
    n = 1000
    out = _floor_run(q, n, bulk_every=15, initial_bulk=10)
    peaks = _window_peaks(out["oldest_age"], 100)
    print(
        f"\nno floor: peak age (in claims) of the oldest bulk job per 100 claims: {peaks}; "
        f"age of the run while bulk work waited: {out['wall_age_ms']} ms"
    )
    assert out["level0_left"] > 0
    assert out["bulk_served"] == []
    assert out["oldest_age"] == list(range(1, n + 1))  # as old as the run: no plateau
    assert len(out["waiting"]) == 10 + n // 15
    # Once the priority-0 work is gone, bulk is served, oldest first.
    drained = 0
    while True:
        got = q.claim(timeout=0, count=100)
        urgent = [d for d in got if d.payload == b"urgent"]
        drained += len(urgent)
        if len(urgent) < len(got):
            first_bulk = got[len(urgent)]
            assert got[: len(urgent)] == urgent  # no bulk before the last urgent one
            break
        assert got and q.ack_many(got)
    assert drained == out["level0_left"]
    assert first_bulk.payload == b"bulk:0"
