"""TaskManagers a previous ResourceManager had registered (the catalog says which), each with the
time by which it must register again with this one. Without this, a TaskManager that died while
no ResourceManager ran would stay REGISTERED in the catalog forever and its tasks would look
RUNNING forever. Pure bookkeeping, driven by a clock."""

from __future__ import annotations

from typing import Container, Iterable

from shared.clock import Clock
from shared.ids import TaskManagerId


class ReturningTaskManagers:
    def __init__(self, clock: Clock, *, timeout_s: float):
        self.clock, self.timeout_s = clock, timeout_s
        self.expected = False  # whether `expect` ran: once per ResourceManager
        self._deadlines: dict[TaskManagerId, float] = {}

    def expect(self, previous: Iterable[TaskManagerId], registered: Container[TaskManagerId]) -> int:
        """Start waiting for the previous ResourceManager's TaskManagers not registered yet;
        returns how many."""
        deadline = self.clock.now() + self.timeout_s
        self._deadlines = {tm_id: deadline for tm_id in previous if tm_id not in registered}
        self.expected = True
        return len(self._deadlines)

    def returned(self, tm_id: TaskManagerId) -> bool:
        """It registered (or unregistered) again: no longer waited for. True if it was."""
        return self._deadlines.pop(tm_id, None) is not None

    def overdue(self) -> list[TaskManagerId]:
        """Those whose time is up, no longer waited for."""
        if not self._deadlines:
            return []
        now = self.clock.now()
        late = [tm_id for tm_id, deadline in self._deadlines.items() if now >= deadline]
        for tm_id in late:
            del self._deadlines[tm_id]
        return late
