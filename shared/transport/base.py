from __future__ import annotations

from typing import Callable, Protocol

from shared.messages import Envelope

Handler = Callable[[Envelope], None]


class Transport(Protocol):
    sender: str

    def publish(self, stream: str, body, *, epoch: int | None = None, sender: str | None = None) -> str: ...

    def publish_many(self, items: list[tuple[str, object]], *, epoch: int | None = None,
                     sender: str | None = None) -> None: ...

    def poll(
        self, stream: str, group: str, consumer: str, handler: Handler, *, count: int = 256,
        block_ms: int = 1000, around_batch=None,
    ) -> int:
        """`around_batch(envelopes)` is a context-manager factory entered around the handlers
        of one batch (a unit of work, which may prefetch what the batch needs); entries are
        acknowledged only after it exits cleanly."""

    def close(self) -> None: ...
