from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from shared.messages import Envelope

if TYPE_CHECKING:
    import redis

Handler = Callable[[Envelope], None]


class Transport(Protocol):
    sender: str

    @property
    def redis_client(self) -> "redis.Redis | None":
        """The Redis connection beside the streams, for what services publish outside them (the
        leader's announcement, task figures, log endpoints); None for a transport without Redis
        (the in-memory one of tests), where those reads find nothing."""

    def publish(self, stream: str, body, *, epoch: int | None = None, sender: str | None = None) -> str: ...

    def publish_many(
        self, items: list[tuple[str, object]], *, epoch: int | None = None, sender: str | None = None
    ) -> None: ...

    def poll(
        self,
        stream: str,
        group: str,
        consumer: str,
        handler: Handler,
        *,
        count: int = 256,
        block_ms: int = 1000,
        around_batch=None,
        also: Sequence[str] = (),
    ) -> int:
        """`around_batch(envelopes)` is a context-manager factory entered around the handlers
        of one batch (a unit of work, which may prefetch what the batch needs); entries are
        acknowledged only after it exits cleanly. `also`: more streams read in the same call
        (the TaskManagers' report streams)."""

    def close(self) -> None: ...
