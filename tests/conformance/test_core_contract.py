"""The contract suite on the core, on Redis 7.x, Redis 6.2, a 3-master cluster and fakeredis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ReliableQueue
from tests.conformance.contract import NewQueue, QueueContract


class TestCoreContract(QueueContract):
    @pytest.fixture
    def new_queue(self, any_client: Any, qname: str) -> Iterator[NewQueue]:
        made: list[ReliableQueue] = []

        def new(**options: Any) -> ReliableQueue:
            options.setdefault("keeper", False)
            q = ReliableQueue(any_client, qname, **options)
            made.append(q)
            return q

        yield new
        for q in made:
            q.close(release=False)
