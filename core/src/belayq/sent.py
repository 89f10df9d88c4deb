"""Calls sent without waiting for their reply: :class:`Sent` keeps the connection until
the reply is read, :class:`Answer` is what a caller holds meanwhile. Also how a connection
is taken out of a redis-py pool across the versions belayq supports."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .errors import RESPONSE_ERROR

if TYPE_CHECKING:
    from .scripts import Arg, ScriptRunner


def pool_connection(pool: Any) -> Any:
    """A connection from a redis-py pool (redis-py before 5.3 wants a command name)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("EVALSHA")


class Sent:
    """A script call sent by :meth:`ScriptRunner.send` whose reply is still unread; its
    connection stays out of the pool until :meth:`reply` reads it."""

    def __init__(
        self, runner: ScriptRunner, pool: Any, conn: Any, name: str, args: Sequence[Arg]
    ) -> None:
        self._runner = runner
        self._pool = pool
        self._conn = conn
        self._name = name
        self._args = args

    def ready(self) -> bool:
        """Whether the reply has arrived (reading it would not wait). A connection error
        says True: reading raises it."""
        if self._conn is None:
            return True
        try:
            return bool(self._conn.can_read(timeout=0))
        except Exception:
            return True

    def reply(self) -> Any:
        """The call's reply (read once). A call that found its script or library missing
        ran nothing: it is loaded and the call runs again, waiting this time.

        Raises:
            redis.ConnectionError: The reply was lost; the call may or may not have run.
        """
        conn, self._conn = self._conn, None
        if conn is None:
            raise RuntimeError("the reply of this call was read already")
        try:
            reply = conn.read_response()
        except RESPONSE_ERROR as exc:
            reply = exc
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._pool.release(conn)
        return self._runner.answer(self._name, self._args, reply)


T = TypeVar("T")


class Answer(Generic[T]):
    """The answer of a call made without waiting for it: :meth:`ready` says whether reading
    it would not wait, calling it reads it (once)."""

    def __init__(self, read: Callable[[], T], sent: Sent | None = None) -> None:
        self._read = read
        self._sent = sent

    def ready(self) -> bool:
        return self._sent is None or self._sent.ready()

    def __call__(self) -> T:
        return self._read()
