"""Where the server's CPU time per message goes, part by part.

The loops of :mod:`.loops` that have a server-CPU target (publish, claim+ack with count=1
and with a batch) run once as belayq ships and once with one part of the work taken out:

* a part of the scripts, by a benchmark-only edit of the Lua text (the queue runs a library
  built from the edited text, under its own name, never shipped): the ACL checks, the reply
  memo (no request id: no lookup, no record), the recovery steps of a claim, the counters;
* the priority levels: the same queue with one level (``priority_steps=(0,)``) instead of
  ten, which also passes 9 keys fewer per call;
* the call itself: a no-op function given the same keys and arguments as the real ones
  (the argument packing and parsing, and the call), measured apart.

A part's cost is the scripts' server time per message (``INFO commandstats`` usec of the
function calls, which varies far less from run to run than the process's CPU time) of the
full run minus that of the run without it, measured in the same rep. Each edit must apply,
or the run stops: a renamed Lua line cannot leave a part silently measured as free.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from belayq import sources

from .counting import measure
from .fixtures import chunks, fresh, make_payloads, need, queue
from .loops import Workload, bq_claim1_ack, bq_claim_batch_ack_many, bq_drained, bq_publish

# (old, new) text edits of the Lua sources, per part.
EDITS: dict[str, tuple[tuple[str, str], ...]] = {
    "ACL checks": (
        ("  if not redis.acl_check_cmd then return end", "  do return end"),
    ),
    "reply memo": (
        ("  REQUEST_ID = any_arg(5, 'request_id')",
         "  REQUEST_ID = any_arg(5, 'request_id') and ''"),
    ),
    "recovery steps": (
        ("local function recover_bounded(k, now, limit, grace_ms)\n",
         "local function recover_bounded(k, now, limit, grace_ms)\n  do return -1 end\n"),
    ),
    "counters": (
        ("local function count(stats, field, by)\n",
         "local function count(stats, field, by)\n  do return end\n"),
    ),
}

#: The paths measured: (name, loop body, whether the queue is filled first).
PATHS: tuple[tuple[str, Callable[[Workload, Any], None], bool], ...] = (
    ("publish", bq_publish, False),
    ("claim+ack, count=1", bq_claim1_ack, True),
    ("claim+ack, count={b}", bq_claim_batch_ack_many, True),
)


@contextlib.contextmanager
def edited_lua(edits: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """Build belayq's scripts and library from the Lua text with ``edits`` applied."""
    original = sources._text
    used = set()

    def text(path: Any) -> str:
        out = original(path)
        for i, (old, new) in enumerate(edits):
            if old in out:
                out = out.replace(old, new)
                used.add(i)
        return out

    def clear() -> None:
        for f in (sources.source, sources.sha, sources.library, sources.commands):
            f.cache_clear()

    sources._text = text  # type: ignore[assignment]
    clear()
    try:
        sources.library()
        need(len(used) == len(edits), f"every Lua edit applies: {edits}")
        yield
    finally:
        sources._text = original  # type: ignore[assignment]
        clear()


@dataclass
class Part:
    name: str
    edits: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()


PARTS: tuple[Part, ...] = (
    Part("as shipped"),
    *(Part(name, edits) for name, edits in EDITS.items()),
    Part("priorities (ten levels vs one)", options=(("priority_steps", (0,)),)),
)


def _run_paths(w: Workload, options: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per path: (server CPU us/msg, the scripts' server time us/msg)."""
    out = {}
    for name, body, filled in PATHS:
        fresh(w.r)
        q = queue(w.r, **options)
        if filled:
            for b in w.batches:
                q.publish_many(b)
        sample = measure(w.r, w.n, functools.partial(body, w, q))
        if filled:
            bq_drained(w, q)
        else:
            q.close(release=False)
        out[name] = (sample.server_cpu_us_per_msg, sample.server_usec_per_msg)
    return out


def _noop_calls(w: Workload) -> dict[str, float]:
    """Server CPU per message of a no-op function with the keys and arguments of each path's
    calls, sent as the real loop sends them."""
    r = w.r
    fresh(r)
    q = queue(r)
    runner = q._scripts
    lib = "belayq_bench_noop"
    r.execute_command(
        "FUNCTION", "LOAD", "REPLACE",
        f"#!lua name={lib}\nredis.register_function('{lib}', function(k, a) return 0 end)",
    )

    def args_of(name: str, args: list[Any], rid: str) -> list[Any]:
        command = runner._command(name, args, rid)
        return ["FCALL", lib, *command[2:]]

    payload = w.payloads[0]
    publish = args_of("publish", [q.config.dedup_window_ms, "id", payload, 1, 0, ""], "id")
    claim1 = args_of("claim", q._claim_args(1), "n")
    ack1 = args_of("ack", ["0", "some-id", "some-token"], "")
    claim_b = args_of("claim", q._claim_args(w.batch), "n")
    ack_b = args_of("ack", ["0", *(["some-id", "some-token"] * w.batch)], "")
    steps = max(1, w.n // w.batch)

    def loop(commands: list[list[Any]], times: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(times):
                for c in commands:
                    r.execute_command(*c)
        return run

    out = {
        "publish": measure(r, w.n, loop([publish], w.n)).server_cpu_us_per_msg,
        "claim+ack, count=1": measure(r, w.n, loop([claim1, ack1], w.n)).server_cpu_us_per_msg,
        "claim+ack, count={b}": measure(
            r, steps * w.batch, loop([claim_b, ack_b], steps)
        ).server_cpu_us_per_msg,
    }
    q.close(release=False)
    r.execute_command("FUNCTION", "DELETE", lib)
    return out


def run_breakdown(r: redis.Redis, n: int, size: int, batch: int) -> dict[str, dict[str, Any]]:
    """One rep, per path: (server CPU, scripts' time) us/msg as shipped and without each
    part, and the server CPU us/msg of the no-op call."""
    payloads = make_payloads(n, size, b"b")
    w = Workload(r, n, batch, payloads, chunks(payloads, batch))
    out: dict[str, dict[str, Any]] = {}
    for part in PARTS:
        # Only this part's library in the server's Lua: every library loaded grows the heap
        # that Lua's garbage collector walks, which would tax the parts measured later.
        r.execute_command("FUNCTION", "FLUSH", "SYNC")
        r.script_flush("SYNC")
        with edited_lua(part.edits):
            out[part.name] = _run_paths(w, dict(part.options))
    out["no-op call, same keys and arguments"] = _noop_calls(w)
    fresh(r)
    return out
