"""Time as a dependency, so strategies, heartbeats and timeouts are tested with a fake clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()


class WallClock:
    """Seconds since the epoch: for times stored in the catalog and read by another process
    (the restart strategy's failure times), where a monotonic clock means nothing."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
