"""Delayed actions for the JobManager loop (restart backoff). Like Flink's `runIfState`, the
action itself re-checks the job's state when it fires; the timer only decides *when*."""

from __future__ import annotations

import heapq
import itertools
from typing import Callable

from shared.clock import Clock


class Timers:
    def __init__(self, clock: Clock):
        self.clock = clock
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def call_later(self, delay_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (self.clock.now() + delay_s, next(self._seq), action))

    def run_due(self) -> int:
        n = 0
        while self._heap and self._heap[0][0] <= self.clock.now():
            _, _, action = heapq.heappop(self._heap)
            action()
            n += 1
        return n

    def pop_due(self) -> Callable[[], None] | None:
        """The next action whose time has come, removed from the queue; None if none is due."""
        if self._heap and self._heap[0][0] <= self.clock.now():
            return heapq.heappop(self._heap)[2]
        return None

    def next_due_in(self) -> float | None:
        return None if not self._heap else max(0.0, self._heap[0][0] - self.clock.now())

    def __len__(self) -> int:
        return len(self._heap)
