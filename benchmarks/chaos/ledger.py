"""The ledger: every execution of a task writes its start and its end to a redis-server the
harness never faults (``CHAOS_LEDGER_URL``), under the run's own prefix (``CHAOS_RUN``).

Keys (prefix ``chaos:<run>:``):

* ``attempts`` hash: task id -> executions started (the attempt number of the next one);
* ``starts`` list: JSON ``[task id, attempt, pid, start]``;
* ``ends`` list: JSON ``[task id, attempt, pid, start, end]``;
* ``running`` hash: ``<task id>#<attempt>`` -> JSON ``[pid, start]``, removed at the end
  (what a killed process was running stays, with its pid);
* ``ppid`` hash: ``<task id>#<attempt>`` -> the parent pid at the start: the worker's main
  process, which holds the message (claim, lease, ack) for a pool child or work horse.

Times are ``time.time()`` seconds (one machine, one clock).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import redis

_client: redis.Redis | None = None


def _conn() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["CHAOS_LEDGER_URL"], socket_timeout=30)
    return _client


def _prefix() -> str:
    return f"chaos:{os.environ['CHAOS_RUN']}:"


def run_task(task_id: str, seconds: float) -> str:
    """The workload: record the start, sleep ``seconds``, record the end."""
    r, p = _conn(), _prefix()
    attempt = int(r.hincrby(p + "attempts", task_id, 1))
    pid, start = os.getpid(), time.time()
    pipe = r.pipeline(transaction=False)
    pipe.rpush(p + "starts", json.dumps([task_id, attempt, pid, start]))
    pipe.hset(p + "running", f"{task_id}#{attempt}", json.dumps([pid, start]))
    pipe.hset(p + "ppid", f"{task_id}#{attempt}", os.getppid())
    pipe.execute()
    time.sleep(seconds)
    end = time.time()
    pipe = r.pipeline(transaction=False)
    pipe.rpush(p + "ends", json.dumps([task_id, attempt, pid, start, end]))
    pipe.hdel(p + "running", f"{task_id}#{attempt}")
    pipe.execute()
    return task_id


@dataclass
class Execution:
    """One run of a task, from the ledger."""

    task_id: str
    attempt: int
    pid: int
    start: float
    end: float | None = None
    ppid: int = 0


@dataclass
class LedgerReader:
    """The harness's view of the ledger of one run."""

    client: redis.Redis
    run: str
    _ends_seen: int = 0
    completed: set[str] = field(default_factory=set)

    @property
    def prefix(self) -> str:
        return f"chaos:{self.run}:"

    def running(self) -> list[Execution]:
        """Executions started and not ended (including those of processes now dead)."""
        out = []
        for key, raw in self.client.hgetall(self.prefix + "running").items():
            name = key.decode() if isinstance(key, bytes) else str(key)
            task_id, _, attempt = name.rpartition("#")
            pid, start = json.loads(raw)
            out.append(Execution(task_id, int(attempt), int(pid), float(start)))
        return out

    def completed_count(self) -> int:
        """Distinct task ids with at least one end (read incrementally)."""
        raw = self.client.lrange(self.prefix + "ends", self._ends_seen, -1)
        self._ends_seen += len(raw)
        for item in raw:
            self.completed.add(json.loads(item)[0])
        return len(self.completed)

    def executions(self) -> list[Execution]:
        """Every execution, with its end if it has one."""
        by_key: dict[tuple[str, int], Execution] = {}
        for item in self.client.lrange(self.prefix + "starts", 0, -1):
            task_id, attempt, pid, start = json.loads(item)
            by_key[(task_id, attempt)] = Execution(task_id, attempt, pid, start)
        for item in self.client.lrange(self.prefix + "ends", 0, -1):
            task_id, attempt, pid, start, end = json.loads(item)
            ex = by_key.setdefault((task_id, attempt), Execution(task_id, attempt, pid, start))
            ex.end = end
        for key, ppid in self.client.hgetall(self.prefix + "ppid").items():
            name = key.decode() if isinstance(key, bytes) else str(key)
            task_id, _, attempt = name.rpartition("#")
            if (task_id, int(attempt)) in by_key:
                by_key[(task_id, int(attempt))].ppid = int(ppid)
        return sorted(by_key.values(), key=lambda e: e.start)

    def raw_counts(self) -> dict[str, Any]:
        p = self.prefix
        return {"starts": self.client.llen(p + "starts"), "ends": self.client.llen(p + "ends")}
