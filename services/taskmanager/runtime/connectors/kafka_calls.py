"""Calls to the Kafka brokers for the exactly-once sink (kafka_transactions.py), with what their
failures mean: a producer the brokers fenced is a SinkFencedError (a newer attempt took the sink);
brokers that are away are waited out for UNAVAILABLE_TIMEOUT_S with a waiting reason; anything
else fails the task, whose restart replays from its last checkpoint."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from shared.errors import TaskError

from .sinks import SinkFencedError

OPERATION_TIMEOUT_S = 30.0
# How long a write or a commit rides out brokers that do not answer before the task fails.
UNAVAILABLE_TIMEOUT_S = 120.0
WAITING_AFTER_S = 2.0
# Beyond a call's own timeout, before a call librdkafka never returns from is given up.
HANG_MARGIN_S = 20.0


class KafkaSinkError(TaskError, RuntimeError):
    """The exactly-once Kafka sink cannot go on; the message says why and what was kept."""


class BrokerCalls:
    """How one sink's client calls the brokers; `fence` is the attempt the sink writes for."""

    def __init__(self, topic: str, bootstrap: str, on_wait: Callable[[str | None], None]):
        self.topic, self.bootstrap, self.on_wait = topic, bootstrap, on_wait
        self.fence = -1

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fn()
        except KafkaException as exc:
            raise self.failure(what, exc) from None

    def failure(self, what: str, exc: BaseException) -> Exception:
        """SinkFencedError for a producer the brokers fenced (a newer attempt took the sink),
        else KafkaSinkError saying what failed."""
        err = exc.args[0] if exc.args and hasattr(exc.args[0], "code") else None  # a KafkaError
        if err is not None and is_fenced(err):
            return SinkFencedError(f"kafka topic {self.topic}", self.fence, None)
        return KafkaSinkError(
            f"kafka sink {self.topic}: {what} failed at {self.bootstrap}: {err or exc}; the open "
            "transaction is abandoned and the task restarts from its last checkpoint"
        )

    def patiently(self, what: str, fn: Callable[[float], Any]) -> Any:
        """`fn(timeout)` retried while the brokers do not answer, with a waiting reason."""
        from confluent_kafka import KafkaException

        started, told, last_said = time.monotonic(), False, -10.0
        try:
            while True:
                try:
                    return fn(OPERATION_TIMEOUT_S / 3)
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else None
                    if err is not None and is_fenced(err):
                        raise self.failure(what, exc) from None
                    retriable = (
                        err is not None
                        and not err.fatal()
                        and not err.txn_requires_abort()
                        and (err.retriable() or err.code() in _unavailable_codes())
                    )
                    waited = time.monotonic() - started
                    if not retriable or waited > UNAVAILABLE_TIMEOUT_S:
                        raise KafkaSinkError(
                            f"kafka sink {self.topic}: {what} failed at {self.bootstrap} after "
                            f"{waited:.0f} s: {err or exc}"
                        ) from None
                    if not told:
                        self.on_wait(f"waiting for the Kafka brokers at {self.bootstrap} ({what})")
                        told = True
                    if waited >= last_said + 10:  # what it waits out, in the driver's log
                        print(f"kafka sink {self.topic}: {what}: {err} ({waited:.0f} s); trying again", flush=True)
                        last_said = waited
        finally:
            if told:
                self.on_wait(None)


def bounded(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """fn() on a thread of its own; KafkaSinkError if it has not returned within timeout_s (the
    thread is left behind: the task fails and its process ends)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name="kafka-sink-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        raise KafkaSinkError(
            f"{what} did not return within {timeout_s:.0f} s (the Kafka client is stuck after a "
            "broker restart); the task restarts from its last checkpoint with a new client"
        )
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def is_fenced(err: Any) -> bool:
    from confluent_kafka import KafkaError

    fenced = {KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH, getattr(KafkaError, "PRODUCER_FENCED", -999)}
    return err.code() in fenced


@functools.cache
def _unavailable_codes() -> frozenset[int]:
    """Errors of brokers that are away or busy for a while (a restart, an election)."""
    from confluent_kafka import KafkaError

    return frozenset(
        {
            KafkaError._TRANSPORT,
            KafkaError._TIMED_OUT,
            KafkaError._ALL_BROKERS_DOWN,
            KafkaError.COORDINATOR_NOT_AVAILABLE,
            KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
            KafkaError.NOT_COORDINATOR,
            KafkaError.CONCURRENT_TRANSACTIONS,
        }
    )
