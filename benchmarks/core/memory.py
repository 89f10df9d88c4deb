"""Redis bytes per message (``INFO memory used_memory`` deltas), queued and in flight:
belayq in id mode against raw lists of the same payloads."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from belayq import ReliableQueue

from .fixtures import RAW_P, RAW_Q, chunks, fresh, make_payloads, need, queue


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def key_bytes(r: redis.Redis, key: str, n: int) -> float:
    """``MEMORY USAGE`` of one key (all of it: ``samples=0``) per message."""
    return float(r.memory_usage(key, samples=0) or 0) / n


def drop_transient(r: redis.Redis, q: ReliableQueue) -> tuple[int, float]:
    """Delete the queue's short-lived memo records (replies kept for re-sent publish and
    claim calls, which the scripts drop after ``reply_window_ms``) and return how many there
    were and that window (s)."""
    count = int(r.hlen(q.keys.memo))
    r.delete(q.keys.memo, q.keys.memo_exp)
    return count, q.config.reply_window_ms / 1000


def run_memory(r: redis.Redis, n: int, size: int, batch: int) -> dict[str, float]:
    """Bytes per message, queued and in flight, belayq (id mode) and raw lists.

    The belayq figures are taken twice: with everything the calls left behind, and again
    after deleting the keys that have a TTL (transient records), i.e. the steady state.
    """
    batches = chunks(make_payloads(n, size, b"mem"), batch)
    out = belayq_memory(r, n, batch, batches)
    out.update(raw_memory(r, n, batch, batches))
    return out


def belayq_memory(r: redis.Redis, n: int, batch: int,
                  batches: Sequence[Sequence[bytes]]) -> dict[str, float]:
    out: dict[str, float] = {}
    fresh(r)
    q = queue(r, keeper=False, lease_ms=600_000)
    m0 = used_memory(r)
    for b in batches:
        q.publish_many(b)
    m1 = used_memory(r)
    k = q.keys
    one = r.lindex(k.ready, 0)
    need(one is not None, "memory: nothing queued")
    out["bq_payloads_queued"] = key_bytes(r, k.payloads, n)
    out["bq_ready_list"] = key_bytes(r, k.ready, n)
    n_tr, ttl = drop_transient(r, q)
    m1s = used_memory(r)
    out["bq_transient_after_publish"] = n_tr / n
    out["bq_transient_ttl_s"] = ttl
    claimed = 0
    while claimed < n:
        got, _ = q.try_claim(batch)
        need(bool(got), "memory: claim got nothing")
        claimed += len(got)
    m2 = used_memory(r)
    out["bq_meta_inflight"] = key_bytes(r, k.meta, n)
    out["bq_processing_list"] = key_bytes(r, k.processing, n)
    out["bq_leases_zset"] = key_bytes(r, k.leases, n)
    n_tr, ttl = drop_transient(r, q)
    m2s = used_memory(r)
    out["bq_transient_after_claim"] = n_tr / n
    out["bq_queued"] = (m1 - m0) / n
    out["bq_queued_steady"] = (m1s - m0) / n
    out["bq_inflight"] = (m2 - m1s + m1 - m0) / n
    out["bq_inflight_steady"] = (m2s - m0) / n
    out["bq_inflight_extra"] = (m2s - m1s) / n
    return out


def raw_memory(r: redis.Redis, n: int, batch: int,
               batches: Sequence[Sequence[bytes]]) -> dict[str, float]:
    out: dict[str, float] = {}
    fresh(r)
    m0 = used_memory(r)
    for b in batches:
        pipe = r.pipeline(transaction=False)
        for p in b:
            pipe.lpush(RAW_Q, p)
        pipe.execute()
    m1 = used_memory(r)
    out["raw_list"] = key_bytes(r, RAW_Q, n)
    moved = 0
    while moved < n:
        pipe = r.pipeline(transaction=False)
        for _ in range(batch):
            pipe.lmove(RAW_Q, RAW_P, "RIGHT", "LEFT")
        moved += sum(v is not None for v in pipe.execute())
    m2 = used_memory(r)
    out["raw_queued"] = (m1 - m0) / n
    out["raw_inflight"] = (m2 - m0) / n
    out["raw_inflight_extra"] = (m2 - m1) / n
    fresh(r)
    return out
