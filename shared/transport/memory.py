"""In-memory twin of the Redis-streams transport, for unit tests of everything above it.

It signs and checks like the Redis one (shared/message_auth.py): one ClusterAuth for the whole
bus (its own secret unless given one), so a component test's messages pass the same sender rules
as the cluster's, and `publish(..., sender=...)` speaks as a TaskManager where a test plays one.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict

from shared import streams
from shared.message_auth import ClusterAuth, RefusedMessage
from shared.messages import Envelope, UndecodableMessage, decode, encode, wrap
from shared.transport.base import Handler


class InMemoryTransport:
    def __init__(self, *, sender: str = "test", epoch: int = 0, auth: ClusterAuth | None = None):
        self.sender = sender
        self.epoch = epoch
        self.auth = auth or ClusterAuth.ephemeral()
        self._lock = threading.Lock()
        # Each entry: (index, the envelope's bytes, their signature or None).
        self._streams: dict[str, list[tuple[int, bytes, str | None]]] = defaultdict(list)
        self._cursor: dict[tuple[str, str], int] = defaultdict(int)
        self._done: set[tuple[str, str]] = set()
        self.dead: list[dict] = []

    @property
    def redis_client(self) -> None:
        return None

    def publish(self, stream: str, body, *, epoch: int | None = None, sender: str | None = None) -> str:
        sender = sender or self.auth.sender_for(body, self.sender)
        env = wrap(body, sender=sender, epoch=self.epoch if epoch is None else epoch)
        return self.publish_envelope(stream, env)

    def publish_many(self, items, *, epoch: int | None = None, sender: str | None = None) -> None:
        for stream, body in items:
            self.publish(stream, body, epoch=epoch, sender=sender)

    def publish_envelope(self, stream: str, env: Envelope) -> str:
        """An envelope as it is (its own sender, epoch and message id), signed."""
        raw = encode(env)
        self.append_raw(stream, raw, self.auth.sign(stream, env.sender, raw))
        return env.message_id

    def append_raw(self, stream: str, raw: bytes, signature: str | None = None) -> None:
        with self._lock:
            entries = self._streams[stream]
            entries.append((len(entries), raw, signature))

    def poll(
        self,
        stream: str,
        group: str,
        consumer: str,
        handler: Handler,
        *,
        count: int = 256,
        block_ms: int = 0,
        around_batch=None,
        also=(),
    ) -> int:
        return sum(self._poll_one(name, group, handler, count, around_batch) for name in dict.fromkeys([stream, *also]))

    def _poll_one(self, stream: str, group: str, handler: Handler, count: int, around_batch) -> int:
        with self._lock:
            start = self._cursor[(stream, group)]
            batch = self._streams[stream][start : start + count]
        done_before = set(self._done)
        envelopes = []
        for _, raw, signature in batch:
            env = self._admit(stream, raw, signature)
            if isinstance(env, Envelope):
                envelopes.append(env)
        try:
            with around_batch(envelopes) if around_batch else contextlib.nullcontext():
                return self._deliver(stream, group, batch, handler)
        except Exception:
            # Like the Redis transport: nothing of a failed batch counts as handled.
            self._cursor[(stream, group)] = start
            self._done = done_before
            raise

    def _admit(self, stream: str, raw: bytes, signature) -> Envelope | str:
        """The envelope, or why it is dead-lettered."""
        try:
            env = decode(raw)
        except UndecodableMessage as exc:
            return str(exc)
        return self.auth.check(stream, env, raw, signature) or env

    def _deliver(self, stream, group, batch, handler) -> int:
        handled = 0
        for idx, raw, signature in batch:
            env = self._admit(stream, raw, signature)
            if not isinstance(env, Envelope):
                self.dead.append({"stream": stream, "error": env, "raw": raw})
                self._cursor[(stream, group)] = idx + 1
                continue
            if (group, env.message_id) not in self._done:
                try:
                    handler(env)
                except RefusedMessage as exc:
                    self.dead.append({"stream": stream, "error": str(exc), "raw": raw})
                handled += 1
                self._done.add((group, env.message_id))
            self._cursor[(stream, group)] = idx + 1
        return handled

    def pending(self, stream: str, group: str) -> int:
        return len(self._streams[stream]) - self._cursor[(stream, group)]

    def bodies(self, stream: str) -> list:
        return [decode(raw).body for _, raw, _ in self._streams[stream]]

    def drain(self, stream: str, group: str, handler: Handler, around_batch=None) -> int:
        total = 0
        while self.pending(stream, group):
            total += self.poll(stream, group, "c", handler, around_batch=around_batch)
        return total

    def close(self) -> None:
        pass


__all__ = ["InMemoryTransport", "streams"]
