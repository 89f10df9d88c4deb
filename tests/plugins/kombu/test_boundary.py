"""The kombu adapter holds no queue logic, no Lua and no key strings (docs/design.md §3.3):
besides tests/test_boundaries.py, it sends no Redis command that changes a queue itself;
every write goes through the core's API or through code it inherits from kombu."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "plugins" / "kombu" / "src" / "belayq_kombu"

WRITES = re.compile(
    r"\.(lpush|rpush|lpop|rpop|lrem|lmove|blmove|brpop|zadd|zrem|hset|hdel|hincrby|set|"
    r"setex|delete|unlink|expire|pexpire|eval|evalsha|register_script|execute_command)\("
)
KEYS = re.compile(
    r"""(?<![fF])["']\{[^}"'\n]*\}:|["'][^"'\n]*:(processing|leases|delayed|dead|stats)\b"""
)


def test_the_adapter_changes_queues_only_through_the_core() -> None:
    offenders = [
        f"{p.name}:{n}: {line.strip()}"
        for p in sorted(SRC.glob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if WRITES.search(line) or KEYS.search(line)
    ]
    assert offenders == []


def test_the_detectors_work() -> None:
    assert WRITES.search("client.lpush(key, payload)")
    assert WRITES.search("self.client.execute_command('BLMOVE', a, b)")
    assert KEYS.search('name = "{celery}:processing"')
    assert not WRITES.search("rq.publish(payload)")
