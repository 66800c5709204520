"""The ResourceManager's answers, collected while it handles a batch of messages and sent in one
pipeline after it: to the JobManager (allocations, failures, losses) and to TaskManagers (their
heartbeat acks)."""

from __future__ import annotations

from shared import streams
from shared.ids import TaskManagerId
from shared.messages import Message
from shared.transport.base import Transport


class Replies:
    def __init__(self) -> None:
        self._items: list[tuple[str, object]] = []

    def to_jobmanager(self, body: Message) -> None:
        self._items.append((streams.JM_STREAM, body))

    def to_taskmanager(self, tm_id: TaskManagerId, body: Message) -> None:
        self._items.append((streams.tm_inbox(tm_id), body))

    def send(self, transport: Transport) -> None:
        if self._items:
            items, self._items = self._items, []
            try:
                transport.publish_many(items)
            except Exception:
                # The messages that caused these were acknowledged already: keep the answers
                # (an allocation the JobManager never hears of would hold its slots forever).
                self._items = items + self._items
                raise
