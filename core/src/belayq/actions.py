"""The dead-letter actions every tool runs the same way (``belayq replay``, the dashboard's
replay and delete): in batches of :data:`BATCH` per script, so no one call holds Redis for
long, whatever the count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: Dead letters replayed or deleted per script.
BATCH = 1000

Progress = Callable[[int, int], Any]


def replay_dead(q: Any, ids: Sequence[str] | None, *,
                on_batch: Progress | None = None) -> int:
    """Replay the dead letters ``ids`` of ``q`` (None: every one dead now, oldest first),
    :data:`BATCH` per script; ``on_batch(done, total)`` after each batch. Returns how many
    were replayed (ids that are no dead letter are skipped)."""
    return _batched(q.replay_dead, q, ids, on_batch)


def delete_dead(q: Any, ids: Sequence[str] | None, *,
                on_batch: Progress | None = None) -> int:
    """Delete the dead letters ``ids`` of ``q`` (None: every one dead now), as
    :func:`replay_dead` replays them. Returns how many were deleted."""
    return _batched(q.delete_dead, q, ids, on_batch)


def _batched(call: Callable[..., int], q: Any, ids: Sequence[str] | None,
             on_batch: Progress | None) -> int:
    done = 0
    if ids is not None:
        asked = list(dict.fromkeys(ids))
        for start in range(0, len(asked), BATCH):
            done += call(asked[start:start + BATCH])
            if on_batch is not None:
                on_batch(min(start + BATCH, len(asked)), len(asked))
        return done
    total = int(q.stats()["dead"])
    handled = 0
    while handled < total:
        step = min(BATCH, total - handled)
        n = call(None, limit=step)
        done += n
        handled += step
        if on_batch is not None:
            on_batch(handled, total)
        if n < step:  # fewer dead than counted: none left
            break
    return done
