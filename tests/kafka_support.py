"""Reading and writing a real Kafka broker from tests: what a `read_committed` consumer sees, and
records produced from outside as a pipeline's input."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable


def read_all(bootstrap: str, topic: str, *, committed_only: bool = True, settle_s: float = 3.0,
             timeout_s: float = 60.0) -> list[bytes]:
    """Every value in `topic` a consumer with `isolation.level` read_committed (or
    read_uncommitted) sees, read until nothing new came for `settle_s`."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed" if committed_only else "read_uncommitted"})
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
