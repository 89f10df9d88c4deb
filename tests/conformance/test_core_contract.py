"""The contract suite on the core: on Redis 7.x, Redis 6.2, Valkey 9.1, a 3-master Redis
Cluster and fakeredis through redis-py's clients, and on Valkey 9.1 and a 3-master Valkey
cluster through valkey-py's (``valkey.Valkey``, ``valkey.cluster.ValkeyCluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from belayq import ReliableQueue
from tests.conformance.contract import NewQueue, QueueContract
from tests.conftest import BACKENDS, make_client

CONTRACT_BACKENDS = (*BACKENDS, "valkey", "valkeypy", "valkeypy-cluster")


@pytest.fixture(params=CONTRACT_BACKENDS)
def contract_client(request: pytest.FixtureRequest) -> Iterator[Any]:
    client = make_client(request, request.param)
    yield client
    client.close()


class TestCoreContract(QueueContract):
    @pytest.fixture
    def new_queue(self, contract_client: Any, qname: str) -> Iterator[NewQueue]:
        made: list[ReliableQueue] = []

        def new(**options: Any) -> ReliableQueue:
            options.setdefault("keeper", False)
            q = ReliableQueue(contract_client, qname, **options)
            made.append(q)
            return q

        yield new
        for q in made:
            q.close(release=False)
