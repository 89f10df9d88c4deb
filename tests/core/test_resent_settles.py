"""A nack, dead letter, release or defer that redis-py re-sends after a dropped connection
(the same command, so the same request id) answers as its first run did, as publish and
claim do: the reply memo keeps the first reply for ``reply_window_ms``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from belayq import Delivery, ReliableQueue


def args_of(d: Delivery) -> dict[str, tuple[str, list[Any], Any]]:
    """Each settle as the queue sends it: script, arguments, the first run's reply."""
    return {
        "nack": ("nack", [d.id, d.token, 0, "failed", "0"], b"ready"),
        "nack-delayed": ("nack", [d.id, d.token, 60_000, "failed", "0"], b"delayed"),
        "dead_letter": ("nack", [d.id, d.token, 0, "bad", "1"], b"dead"),
        "release": ("release", [d.id, d.token], 1),
        "defer": ("defer", [d.id, d.token, 60_000], 1),
    }


@pytest.mark.parametrize("op", ["nack", "nack-delayed", "dead_letter", "release", "defer"])
def test_a_resent_settle_answers_as_its_first_run(q: ReliableQueue, op: str) -> None:
    q.publish(b"a")
    [d] = q.claim(timeout=0)
    name, args, reply = args_of(d)[op]
    first = q._scripts.run(name, *args, request_id="resent-1")
    stats = q.stats()
    again = q._scripts.run(name, *args, request_id="resent-1")
    assert first == again == reply
    assert q.stats() == stats  # the re-send changed nothing, not even stale_acks
    other = q._scripts.run(name, *args, request_id="another-call")
    assert other in (b"stale", 0)  # a new call finds the claim settled


def test_each_settle_call_has_its_own_request_id(q: ReliableQueue) -> None:
    sent: list[str] = []
    run: Callable[..., Any] = q._scripts.run

    def recording(name: str, *args: Any, request_id: str = "", **kw: Any) -> Any:
        sent.append(request_id)
        return run(name, *args, request_id=request_id, **kw)

    q._scripts.run = recording  # type: ignore[method-assign]
    q.publish_many([b"a", b"b", b"c", b"d"])
    a, b, c, d = q.claim(timeout=0, count=4)
    q.nack(a)
    q.dead_letter(b, "bad")
    q.release([c])
    q.defer([(d, 1000)])
    settles = sent[-4:]
    assert all(len(r) == 16 for r in settles) and len(set(settles)) == 4
