"""In-memory twin of the Redis-streams transport, for unit tests of everything above it."""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict

from shared import streams
from shared.messages import UndecodableMessage, decode, encode, wrap
from shared.transport.base import Handler


class InMemoryTransport:
    def __init__(self, *, sender: str = "test", epoch: int = 0):
        self.sender = sender
        self.epoch = epoch
        self._lock = threading.Lock()
        self._streams: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
        self._cursor: dict[tuple[str, str], int] = defaultdict(int)
        self._done: set[tuple[str, str]] = set()
        self.dead: list[dict] = []

    def publish(self, stream: str, body, *, epoch: int | None = None) -> str:
        env = wrap(body, sender=self.sender, epoch=self.epoch if epoch is None else epoch)
        self.append_raw(stream, encode(env))
        return env.message_id

    def publish_many(self, items, *, epoch: int | None = None) -> None:
        for stream, body in items:
            self.publish(stream, body, epoch=epoch)

    def append_raw(self, stream: str, raw: bytes) -> None:
        with self._lock:
            entries = self._streams[stream]
            entries.append((len(entries), raw))

    def poll(self, stream: str, group: str, consumer: str, handler: Handler, *, count: int = 256,
             block_ms: int = 0, around_batch=None) -> int:
        with self._lock:
            start = self._cursor[(stream, group)]
            batch = self._streams[stream][start:start + count]
        done_before = set(self._done)
        envelopes = []
        for _, raw in batch:
            try:
                envelopes.append(decode(raw))
            except UndecodableMessage:
                pass
        try:
            with (around_batch(envelopes) if around_batch else contextlib.nullcontext()):
                return self._deliver(stream, group, batch, handler)
        except Exception:
            # Like the Redis transport: nothing of a failed batch counts as handled.
            self._cursor[(stream, group)] = start
            self._done = done_before
            raise

    def _deliver(self, stream, group, batch, handler) -> int:
        handled = 0
        for idx, raw in batch:
            try:
                env = decode(raw)
            except UndecodableMessage as exc:
                self.dead.append({"stream": stream, "error": str(exc), "raw": raw})
                self._cursor[(stream, group)] = idx + 1
                continue
            if (group, env.message_id) not in self._done:
                handler(env)
                handled += 1
                self._done.add((group, env.message_id))
            self._cursor[(stream, group)] = idx + 1
        return handled

    def pending(self, stream: str, group: str) -> int:
        return len(self._streams[stream]) - self._cursor[(stream, group)]

    def bodies(self, stream: str) -> list:
        return [decode(raw).body for _, raw in self._streams[stream]]

    def drain(self, stream: str, group: str, handler: Handler, around_batch=None) -> int:
        total = 0
        while self.pending(stream, group):
            total += self.poll(stream, group, "c", handler, around_batch=around_batch)
        return total

    def close(self) -> None:
        pass


__all__ = ["InMemoryTransport", "streams"]
