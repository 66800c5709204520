"""The broker's cluster id (services/cluster/kafka_broker.py): one in 64 random ids began with '-',
which Kafka's storage tool read as an option, and the broker never started."""

from __future__ import annotations

import base64
import uuid

from services.cluster import kafka_broker


def test_a_cluster_id_never_starts_with_a_dash_and_is_16_bytes_of_url_safe_base64(monkeypatch):
    dashed = uuid.UUID(bytes=b"\xfb" + bytes(15))  # encodes to '-wAA...'
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    drawn = iter([dashed, uuid.UUID(int=42)])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(drawn))
    made = kafka_broker.new_cluster_id()
    assert not made.startswith("-") and len(made) == 22
    assert base64.urlsafe_b64decode(made + "==") == uuid.UUID(int=42).bytes
