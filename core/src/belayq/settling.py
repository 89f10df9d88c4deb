"""Settling claims: :meth:`ack`, :meth:`nack`, :meth:`dead_letter`, :meth:`release` and
:meth:`defer` of :class:`~belayq.ReliableQueue` (mixed into it). Each presents the claim's
fencing token; a claim another one holds now is refused and counted (``stale_acks``)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from .arguments import check_deliveries, check_delivery, check_int, check_text
from .config import QueueConfig
from .constants import REASON_MAX_CHARS, RESULT_MAX_BYTES
from .errors import ConfigError
from .errors import redis_errors as _redis_errors
from .holding import HeldClaims
from .models import Delivery
from .models import text as _text
from .scripts import Arg, ScriptRunner, request_id
from .sent import Answer


def _result_text(result: bytes | str | None) -> str:
    """A result as the history keeps it: text (bytes decoded, undecodable bytes escaped),
    cut to ``RESULT_MAX_BYTES``."""
    if result is None:
        return ""
    text = result.decode("utf-8", "backslashreplace") if isinstance(result, bytes) else str(result)
    return text.encode("utf-8")[:RESULT_MAX_BYTES].decode("utf-8", "ignore")


class Settling(HeldClaims):
    """Settling claims, mixed into :class:`~belayq.ReliableQueue`."""

    config: QueueConfig
    _scripts: ScriptRunner

    @property
    def _owner(self) -> tuple[str, str]:
        """``(queue, shard)`` as the deliveries this object claims name them."""
        return (self.sharded_as or self.name, self.name if self.sharded_as else "")

    @staticmethod
    def _pairs(deliveries: Iterable[Delivery]) -> list[Arg]:
        return [x for d in deliveries for x in (d.id, d.token)]

    def ack(self, delivery: Delivery, result: bytes | str | None = None) -> bool:
        """Settle a claim for good. False (and counted) if another claim holds it now.

        Args:
            delivery: The claim.
            result: A small result kept with the message in the done history (``history_max``;
                cut to ``RESULT_MAX_BYTES``). Ignored when the history is off.
        """
        return self.ack_many([delivery], None if result is None else [result])[0]

    @_redis_errors
    def ack_many(
        self, deliveries: Sequence[Delivery],
        results: Sequence[bytes | str | None] | None = None,
    ) -> list[bool]:
        """Ack many claims in one script; one bool per claim (``results``: one per claim,
        see :meth:`ack`).

        A claim whose message is no longer in the queue at all (a re-sent ack whose first
        run settled it) answers True.

        Raises:
            ConfigError: A claim that is not a Delivery of this queue, or ``results``
                that do not match.
        """
        args = self._ack_args(deliveries, results)
        if not deliveries:
            return []
        with self._settling(deliveries):
            reply = self._scripts.run("ack", *args, durable=self.config.durable)
        done = [bool(int(x)) for x in reply]
        self._observe_acked(deliveries, done)
        return done

    @_redis_errors
    def send_ack_many(self, deliveries: Sequence[Delivery]) -> Answer[list[bool]]:
        """:meth:`ack_many` without waiting for Redis's answer: the ack is on its way when
        this returns (it gets there even if the process is killed next), and the claims are
        no longer kept alive. The :class:`~belayq.sent.Answer` returned reads the answer,
        one bool per claim (call it once); when it raises, the claims are held again, as
        after a failed :meth:`ack_many`. With ``wait_replicas`` or ``wait_aof``, or on a
        cluster client, the ack is sent and answered before this returns.

        Raises:
            ConfigError: A claim that is not a Delivery of this queue.
            ConnectionLost: The ack could not be sent (the returned function raises it
                too when the answer was lost: the ack may or may not have run).
        """
        args = self._ack_args(deliveries)
        sent = None
        if deliveries and not self.config.durable:
            with self._settling(deliveries):
                sent = self._scripts.send("ack", *args)
        if sent is None:
            outcome = self.ack_many(deliveries)
            return Answer(lambda: outcome)
        answer = sent.reply

        @_redis_errors
        def read() -> list[bool]:
            with self._settling(deliveries):
                done = [bool(int(x)) for x in answer()]
            self._observe_acked(deliveries, done)
            return done

        return Answer(read, sent)

    def _ack_args(
        self, deliveries: Sequence[Delivery],
        results: Sequence[bytes | str | None] | None = None,
    ) -> list[Arg]:
        check_deliveries("ack", deliveries, self._owner)
        if results is not None:
            if not isinstance(results, Sequence) or isinstance(results, (str, bytes)):
                raise ConfigError(f"results must be a sequence, got {type(results).__name__}")
            if len(results) != len(deliveries):
                raise ConfigError(
                    f"ack_many got {len(results)} results for {len(deliveries)} claims"
                )
            for result in results:
                if result is not None and not isinstance(result, (bytes, str)):
                    raise ConfigError(
                        f"a result must be bytes, str or None, got {type(result).__name__}"
                    )
        if results is None or not self.config.history_max:
            return ["0", *self._pairs(deliveries)]
        args: list[Arg] = ["1"]
        for d, result in zip(deliveries, results, strict=True):
            args += [d.id, d.token, _result_text(result)]
        return args

    def ack_on(self, pipeline: Any, deliveries: Sequence[Delivery]) -> None:
        """Queue the ack of ``deliveries`` on the caller's pipeline or transaction (no round
        trip of its own), with the metrics' observations when they are due. It is sent as
        EVAL with the script's text, so a server that lost its script cache (restart,
        failover, SCRIPT FLUSH) still commits it with the rest of the caller's transaction.
        The reply, one 1/0 per claim, comes with the pipeline's (and the observations'
        writes, when queued, after it)."""
        self._forget(deliveries)
        self._scripts.queue_on(pipeline, "ack", *self._ack_args(deliveries))
        self._observe_acked(deliveries, [True] * len(deliveries), pipeline)

    @_redis_errors
    def nack(self, delivery: Delivery, *, delay_ms: int | None = 0, reason: str = "") -> str:
        """Give a claim back after a failed run (the run counts as an attempt).

        Args:
            delivery: The claim.
            delay_ms: 0 = ready again now (front of its list); > 0 = delayed that long;
                None = exponential backoff with jitter from ``retry_base_ms``.
            reason: Kept as the message's last error (shown in dead letters).

        Returns:
            ``"ready"``, ``"delayed"``, ``"dead"`` (max_deliveries runs reached) or
            ``"stale"`` (another claim holds it now, or it is gone).

        Raises:
            ConfigError: Not a Delivery of this queue, a delay that is not None or an int
                >= 0, or a reason that is not a str. Nothing is sent: the claim is still held.
        """
        check_delivery("nack", delivery, self._owner)
        check_text("reason", reason)
        if delay_ms is not None:
            check_int("delay_ms", delay_ms)
        else:
            delay_ms = self.backoff_ms(max(delivery.attempts, delivery.deliveries))
        with self._settling([delivery]):
            args: list[Arg] = [delivery.id, delivery.token, delay_ms,
                               reason[:REASON_MAX_CHARS], "0"]
            reply = self._scripts.run(
                "nack", *args, request_id=request_id(), durable=self.config.durable
            )
        return _text(reply)

    @_redis_errors
    def dead_letter(self, delivery: Delivery, reason: str, *, runs_before: int = 0,
                    payload: bytes | None = None) -> bool:
        """Dead-letter a claim now (a malformed or unknown message, or one the framework
        gave up on). False if stale.

        Args:
            delivery: The claim.
            reason: Why (shown in the dead letter).
            runs_before: Runs the framework made of this message under earlier ids (a
                framework that retries by sending a new message, as Dramatiq): the dead
                letter counts them among its deliveries and runs.
            payload: The payload the dead letter keeps instead of the claimed one: what a
                replay delivers (e.g. the message with its framework's retry count reset).
                Not with ``payload_in_list``, where the entry is the payload.

        Raises:
            ConfigError: Not a Delivery of this queue, a reason that is not a str, a
                ``runs_before`` that is no int >= 0, or a ``payload`` that is no non-empty
                bytes, or given with ``payload_in_list``. Nothing is sent.
        """
        check_delivery("dead_letter", delivery, self._owner)
        check_text("reason", reason)
        check_int("runs_before", runs_before)
        if payload is not None and (not isinstance(payload, bytes) or not payload
                                    or self.config.payload_in_list):
            raise ConfigError(
                "payload must be non-empty bytes, on a queue whose payloads are not its list "
                f"entries (payload_in_list=False); got {type(payload).__name__} with "
                f"payload_in_list={self.config.payload_in_list}"
            )
        with self._settling([delivery]):
            args: list[Arg] = [delivery.id, delivery.token, 0, reason[:REASON_MAX_CHARS], "1"]
            if runs_before or payload is not None:
                args += [runs_before, payload or b""]
            reply = self._scripts.run(
                "nack", *args, request_id=request_id(), durable=self.config.durable
            )
        return _text(reply) == "dead"

    def backoff_ms(self, deliveries: int) -> int:
        """Exponential backoff with jitter for a message run ``deliveries`` times: drawn
        between half the capped exponential and all of it ("equal jitter")."""
        cap = min(self.config.retry_max_ms, self.config.retry_base_ms * 2 ** max(0, deliveries - 1))
        return random.randint(cap // 2, cap)

    @_redis_errors
    def release(self, deliveries: Sequence[Delivery]) -> int:
        """Hand unstarted claims back to the front of the queue (uncounted deliveries).

        Raises:
            ConfigError: A claim that is not a Delivery of this queue.
        """
        check_deliveries("release", deliveries, self._owner)
        if not deliveries:
            return 0
        with self._settling(deliveries):
            released = int(
                self._scripts.run(
                    "release", *self._pairs(deliveries), request_id=request_id(),
                    durable=self.config.durable,
                )
            )
        return released

    @_redis_errors
    def defer(self, deferrals: Sequence[tuple[Delivery, int]]) -> int:
        """Hand unstarted claims back to wait in the delayed set, each ``(delivery,
        delay_ms)`` until ``delay_ms`` from now on the server's clock; the deliveries do not
        count. A consumer that finds a message's time has not come (a Celery ETA) defers
        it instead of holding it.

        Returns:
            How many were deferred (a claim that another one holds now is refused).

        Raises:
            ConfigError: Not a sequence of ``(Delivery, delay_ms)``, or a delay that is not
                an int >= 0.
        """
        if not isinstance(deferrals, Sequence) or isinstance(deferrals, (str, bytes)):
            raise ConfigError(f"defer takes a sequence of (delivery, delay_ms), got {deferrals!r}")
        args: list[Arg] = []
        for pair in deferrals:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ConfigError(f"defer takes (delivery, delay_ms) pairs, got {pair!r}")
            d, delay_ms = pair
            check_delivery("defer", d, self._owner)
            args += [d.id, d.token, check_int("delay_ms", delay_ms)]
        if not deferrals:
            return 0
        with self._settling([d for d, _ in deferrals]):
            return int(
                self._scripts.run(
                    "defer", *args, request_id=request_id(), durable=self.config.durable
                )
            )
