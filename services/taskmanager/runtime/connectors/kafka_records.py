"""Records into the exactly-once Kafka sink's open transaction (kafka_transactions.py): produced
through the client's local queue, then flushed until the brokers acknowledged every one. A full
queue or brokers that do not acknowledge are waited out with a waiting reason for
UNAVAILABLE_TIMEOUT_S; a record the brokers refused fails the task (its transaction is abandoned),
and a producer they fenced is a SinkFencedError."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from .kafka_calls import UNAVAILABLE_TIMEOUT_S, WAITING_AFTER_S, BrokerCalls, KafkaSinkError, is_fenced
from .sinks import SinkFencedError


class RecordShipper:
    """One sink's records into its producer (set by the writer when it opens one)."""

    def __init__(self, topic: str, bootstrap: str, calls: BrokerCalls) -> None:
        self.topic, self.bootstrap, self.calls = topic, bootstrap, calls
        self.on_wait = calls.on_wait
        self.producer: Any = None
        self._errors: list[Any] = []

    def produce(self, rows: Iterator[tuple[Any, ...]]) -> int:
        from confluent_kafka import KafkaException

        try:
            return self._produce_all(rows)
        except KafkaException as exc:  # the producer itself is done for (fenced, fatal)
            raise self.calls.failure("writing a record", exc) from None

    def _produce_all(self, rows: Iterator[tuple[Any, ...]]) -> int:
        produce, poll, topic = self.producer.produce, self.producer.poll, self.topic
        count = 0
        for value, key, headers, partition in rows:
            kwargs: dict[str, Any] = {"value": value, "key": key}
            if headers:
                kwargs["headers"] = headers
            if partition is not None:
                kwargs["partition"] = partition
            blocked_since: float | None = None
            told = False
            while True:
                try:
                    produce(topic, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    blocked_since = blocked_since or time.monotonic()
                    told = self._wait_for_room(time.monotonic() - blocked_since, told)
                    poll(0.05)
            if told:
                self.on_wait(None)
            count += 1
            if count % 10_000 == 0:
                poll(0)
        return count

    def _wait_for_room(self, waited_s: float, told: bool) -> bool:
        """The client's queue stays full while the brokers do not take records: say so once, and
        give up (the task restarts from its last checkpoint) after UNAVAILABLE_TIMEOUT_S. Returns
        whether the waiting reason is out."""
        if waited_s > UNAVAILABLE_TIMEOUT_S:
            raise KafkaSinkError(
                f"kafka sink {self.topic}: the brokers at {self.bootstrap} took no records for "
                f"{UNAVAILABLE_TIMEOUT_S:.0f} s; the task restarts from its last checkpoint"
            )
        if waited_s > WAITING_AFTER_S and not told:
            self.on_wait(
                f"waiting for the Kafka brokers at {self.bootstrap} to take records (the client's queue is full)"
            )
            return True
        return told

    def delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(err)

    def flush(self) -> None:
        from confluent_kafka import KafkaException

        started, told = time.monotonic(), False
        while True:
            try:
                left = self.producer.flush(1.0)
            except (KafkaException, SystemError) as exc:
                # A fatal error (fenced) surfaces from flush itself; as a SystemError when it came
                # while a delivery callback ran, with the KafkaException as its cause, or none (the
                # deliveries' own errors then say what it was).
                cause = exc if isinstance(exc, KafkaException) else exc.__cause__ or exc.__context__
                if cause is None and self._errors:
                    err, self._errors = self._errors[0], []
                    if is_fenced(err):
                        raise SinkFencedError(f"kafka topic {self.topic}", self.calls.fence, None) from None
                raise self.calls.failure("flushing the transaction's records", cause or exc) from None
            if self._errors:
                err, self._errors = self._errors[0], []
                if is_fenced(err):
                    raise SinkFencedError(f"kafka topic {self.topic}", self.calls.fence, None)
                raise KafkaSinkError(
                    f"kafka sink {self.topic}: a record was not written ({err}); the open "
                    "transaction is abandoned and the task restarts from its last checkpoint"
                )
            if left == 0:
                break
            waited = time.monotonic() - started
            if waited > UNAVAILABLE_TIMEOUT_S:
                raise KafkaSinkError(
                    f"kafka sink {self.topic}: {left} records not acknowledged by {self.bootstrap} "
                    f"within {UNAVAILABLE_TIMEOUT_S:.0f} s"
                )
            if waited > WAITING_AFTER_S and not told:
                self.on_wait(f"waiting for the Kafka brokers at {self.bootstrap} to acknowledge {left} records")
                told = True
        if told:
            self.on_wait(None)
