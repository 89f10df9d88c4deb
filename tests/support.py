"""Helpers the test packages share (fixtures live in the conftest files)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import redis
from redis.connection import AbstractConnection


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: Any, step: float = 0.05
) -> Any:
    """Poll ``predicate`` every ``step`` s until it returns something true, and return that;
    fail after ``timeout`` s, naming ``what`` (a str, or a callable giving one, called only
    when the wait failed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {shown}")
        time.sleep(step)


@contextlib.contextmanager
def reply_lost_once(
    script: str | None = None, between: Callable[[], Any] | None = None
) -> Iterator[list[Any]]:
    """The first reply to a call of belayq's script ``script`` (of any of them: None) is
    lost after the server ran the call (read, then the connection drops), so redis-py's
    retry sends the very same command again, as it does after a dropped connection. Yields
    a list that holds the lost reply once it was lost. ``between`` runs once the reply is
    lost, before the re-send (what other clients do meanwhile)."""
    from belayq.sources import script_of

    lost: list[Any] = []
    send, read = AbstractConnection.send_command, AbstractConnection.read_response
    losing: set[int] = set()

    def sending(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = script_of(args)
        if not lost and not losing and found and found == (script or found):
            losing.add(id(self))
        return send(self, *args, **kwargs)

    def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = read(self, *args, **kwargs)
        if id(self) in losing:
            losing.discard(id(self))
            lost.append(reply)
            self.disconnect()
            if between is not None:
                between()
            raise redis.ConnectionError("the reply was lost (the connection dropped)")
        return reply

    with (
        mock.patch.object(AbstractConnection, "send_command", sending),
        mock.patch.object(AbstractConnection, "read_response", reading),
    ):
        yield lost


def key_picture(client: Any, key: Any) -> Any:
    """What a key holds, comparable across reads: its DUMP, but a hash's or a set's
    content sorted (a hash table's DUMP follows its iteration order, which an incremental
    rehash, run by reads alone, may change); None when the key does not exist."""
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "hash":
        return ("hash", sorted(client.hgetall(key).items()))
    if kind == "set":
        return ("set", sorted(client.smembers(key)))
    return client.dump(key)
