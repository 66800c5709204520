"""Reading and writing a real Kafka broker from tests: what a `read_committed` consumer sees, and
records produced from outside as a pipeline's input."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone

# As tests/e2e/counting.py's events: key k<n mod 5>, value n, event time 20 ms per event.
KEYS = 5
BASE = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
STEP_MS = 20


def counting_event(n: int) -> str:
    """Event n as the counting drills produce it (their totals: tests/e2e/counting.expected_totals)."""
    return json.dumps(
        {
            "key": f"k{n % KEYS}",
            "n": n,
            "value": n,
            "event_time": (BASE + timedelta(milliseconds=n * STEP_MS)).isoformat(),
        }
    )


class Feeder:
    """Produces numbered records into a topic at a steady rate from a thread of its own, riding out
    a broker that is away (the producer buffers and retries); `json_events`: counting events,
    else the number itself."""

    def __init__(self, bootstrap: str, topic: str, rate: float, json_events: bool = False):
        from confluent_kafka import Producer

        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "message.timeout.ms": 300_000}
        )
        self.topic, self.rate, self.json_events = topic, rate, json_events
        self.produced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Feeder":
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            for n in range(self.produced, due):
                value = counting_event(n) if self.json_events else str(n)
                self.producer.produce(self.topic, value=value.encode(), key=f"k{n % KEYS}".encode())
            self.produced = max(self.produced, due)
            self.producer.poll(0)
            time.sleep(0.05)

    def stop(self) -> int:
        """Stop producing; the number of records produced, once every one is acknowledged."""
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(180) == 0, "the feeder's records were not all acknowledged"
        return self.produced


def read_all(
    bootstrap: str, topic: str, *, committed_only: bool = True, settle_s: float = 3.0, timeout_s: float = 60.0
) -> list[bytes]:
    """Every value in `topic` a consumer with `isolation.level` read_committed (or
    read_uncommitted) sees, read until nothing new came for `settle_s`."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - quiet_since < settle_s:
            batch = consumer.consume(10_000, 0.5)
            got = [m.value() for m in batch if m.error() is None]
            if got:
                values.extend(got)
                quiet_since = time.monotonic()
    finally:
        consumer.close()
    return values


def produce(bootstrap: str, topic: str, values: Iterable[bytes | str], *, key_of=None) -> int:
    """Produce `values` (with keys from `key_of(value)` if given) and wait until all are acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    count = 0
    for value in values:
        data = value.encode() if isinstance(value, str) else value
        key = key_of(value) if key_of else None
        while True:
            try:
                producer.produce(topic, value=data, key=key.encode() if isinstance(key, str) else key)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
    left = producer.flush(60)
    assert left == 0, f"{left} records were not acknowledged"
    return count
