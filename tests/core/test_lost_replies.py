"""A call that redis-py sends again after its reply was lost (the connection dropped once
the server had run it) answers as its first run did and changes nothing more: the
administration calls that delete or move messages (delete and replay dead letters, purge,
promote, pause and resume) and the sweep, as publish, claim and the settles do. Each runs
for real, loses its first reply and is re-sent by redis-py's own retry."""

from __future__ import annotations

import pytest

from belayq import ReliableQueue
from tests.support import reply_lost_once


def dead_letters(q: ReliableQueue, n: int) -> None:
    q.publish_many([f"m{i}".encode() for i in range(n)])
    for d in q.claim(timeout=0, count=n):
        assert q.dead_letter(d, "bad")


def test_delete_dead_resent_after_a_lost_reply_deletes_its_limit_once(
    q: ReliableQueue,
) -> None:
    dead_letters(q, 5)
    with reply_lost_once() as lost:
        assert q.delete_dead(limit=2) == 2
    assert lost, "the first reply was not lost: the test proved nothing"
    assert q.stats()["dead"] == 3
    assert q.stats()["discarded"] == 2


def test_delete_dead_by_ids_resent_after_a_lost_reply_answers_as_its_first_run(
    q: ReliableQueue,
) -> None:
    dead_letters(q, 3)
    ids = [d.id for d in q.dead_letters()][:2]
    with reply_lost_once() as lost:
        assert q.delete_dead(ids) == 2
    assert lost and q.stats()["dead"] == 1


def test_replay_dead_resent_after_a_lost_reply_replays_its_limit_once(
    q: ReliableQueue,
) -> None:
    dead_letters(q, 5)
    with reply_lost_once("replay") as lost:
        assert q.replay_dead(limit=2) == 2
    assert lost
    s = q.stats()
    assert (s["dead"], s["ready"], s["replayed"]) == (3, 2, 2)


def test_a_purge_batch_resent_after_a_lost_reply_deletes_one_batch(
    q: ReliableQueue, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("belayq.admin.PURGE_BATCH", 2)
    q.publish_many([b"a", b"b", b"c", b"d", b"e"])
    counts: list[int] = []
    with reply_lost_once("purge") as lost:
        assert q.purge(on_batch=counts.append) == 5
    assert lost
    assert counts == [2, 4]  # the lost batch counted once, none deleted uncounted
    assert q.stats()["purged"] == 5


def test_promote_resent_after_a_lost_reply_promotes_its_batch_once(q: ReliableQueue) -> None:
    for i in range(3):
        q.publish(f"later{i}".encode(), delay_ms=600_000)
    with reply_lost_once("promote") as lost:
        reply = q._scripts.run("promote", 2)
    assert lost and [int(x) for x in reply] == [2, 1]
    s = q.stats()
    assert (s["ready"], s["delayed"]) == (2, 1)


@pytest.mark.parametrize("action", ["pause", "resume"])
def test_pause_and_resume_resent_after_a_lost_reply_answer_true(
    q: ReliableQueue, action: str,
) -> None:
    if action == "resume":
        assert q.pause()
    with reply_lost_once(action) as lost:
        assert getattr(q, action)() is True
    assert lost


def test_a_sweep_resent_after_a_lost_reply_answers_what_it_did(q: ReliableQueue) -> None:
    q.publish_many([b"a", b"b"])
    q.forget(q.claim(timeout=0, count=2))
    q._scripts.skew_ms = 6_000  # both leases have expired
    with reply_lost_once("sweep") as lost:
        result = q.sweep()
    assert lost and result.reclaimed == 2
    assert q.stats()["reclaimed"] == 2


# A first run that changed nothing keeps its reply too: its re-send must not act on what
# arrived between the two runs.


def test_delete_dead_resent_after_a_first_run_that_deleted_nothing_deletes_nothing(
    q: ReliableQueue,
) -> None:
    with reply_lost_once("discard", between=lambda: dead_letters(q, 2)) as lost:
        assert q.delete_dead(limit=10) == 0
    assert lost, "the first reply was not lost: the test proved nothing"
    assert q.stats()["dead"] == 2


def test_delete_dead_by_ids_resent_after_a_first_run_that_found_none_deletes_nothing(
    q: ReliableQueue,
) -> None:
    waiting = q.publish(b"not dead yet")

    def dies() -> None:  # the id named becomes a dead letter before the re-send
        for d in q.claim(timeout=0):
            assert q.dead_letter(d, "bad")

    with reply_lost_once("discard", between=dies) as lost:
        assert q.delete_dead([waiting]) == 0
    assert lost and [d.id for d in q.dead_letters()] == [waiting]


def test_replay_dead_resent_after_a_first_run_that_replayed_nothing_replays_nothing(
    q: ReliableQueue,
) -> None:
    with reply_lost_once("replay", between=lambda: dead_letters(q, 2)) as lost:
        assert q.replay_dead(limit=10) == 0
    assert lost
    s = q.stats()
    assert (s["dead"], s["ready"]) == (2, 0)


def test_purge_resent_after_a_first_run_that_purged_nothing_purges_nothing(
    q: ReliableQueue,
) -> None:
    with reply_lost_once("purge", between=lambda: q.publish(b"late")) as lost:
        assert q.purge() == 0
    assert lost and q.stats()["ready"] == 1


def test_promote_resent_after_a_first_run_that_promoted_nothing_promotes_nothing(
    q: ReliableQueue,
) -> None:
    with reply_lost_once(
        "promote", between=lambda: q.publish(b"later", delay_ms=600_000)
    ) as lost:
        reply = q._scripts.run("promote", 2)
    assert lost and [int(x) for x in reply] == [0, 0]
    s = q.stats()
    assert (s["ready"], s["delayed"]) == (0, 1)
