"""Which TaskManager a request of p slots goes to, found without a scan over the TaskManagers
(slot_manager.py keeps it in step with every change to a TaskManager's slots).

A ready warm driver that fits first (warm_drivers.py), then the TaskManager with the most free
slots (spreading). TaskManagers are bucketed by free slot count, so a choice costs O(max slots),
not O(TaskManagers); the count of TaskManagers of each size gives the largest without a scan too
(a scan per registration made 10,000 registrations quadratic).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from services.resourcemanager.warm_drivers import WarmDriverIndex
from shared.ids import TaskManagerId

if TYPE_CHECKING:
    from services.resourcemanager.slot_manager import TaskManagerEntry


class FreeSlotIndex:
    """Holds each TaskManager as it was when added: remove it before its slots or warm drivers
    change and add it again after."""

    def __init__(self) -> None:
        self._by_free: dict[int, set[TaskManagerId]] = {}  # free slot count -> TaskManagers with that many
        self._warm = WarmDriverIndex()
        self._free_total = 0
        self._totals: Counter[int] = Counter()  # slot total -> how many TaskManagers have it

    def add(self, entry: TaskManagerEntry) -> None:
        free = len(entry.free_indices())
        self._by_free.setdefault(free, set()).add(entry.taskmanager_id)
        if entry.ready_warm_drivers() > 0:
            self._warm.add(entry.taskmanager_id, free=free, parallelism=entry.warm_parallelism)
        self._totals[entry.total] += 1
        self._free_total += free

    def discard(self, entry: TaskManagerEntry) -> None:
        free = len(entry.free_indices())
        self._by_free.setdefault(free, set()).discard(entry.taskmanager_id)
        if entry.ready_warm_drivers() > 0:
            self._warm.discard(entry.taskmanager_id, free=free, parallelism=entry.warm_parallelism)
        self._totals[entry.total] -= 1
        if self._totals[entry.total] <= 0:
            del self._totals[entry.total]
        self._free_total -= free

    def free_total(self) -> int:
        return self._free_total

    def largest(self) -> int:
        """The slot total of the largest TaskManager held (0: none)."""
        return max(self._totals, default=0)

    def choose(self, slots: int) -> tuple[TaskManagerId, bool] | None:
        """(the TaskManager to hold `slots` slots, whether for a ready warm driver), or None if
        none has that many free."""
        if slots > self._free_total:
            return None
        warm_id = self._warm.best_for(slots)
        if warm_id is not None:
            return warm_id, True
        most = max((f for f, ids in self._by_free.items() if ids and f >= slots), default=None)
        return None if most is None else (next(iter(self._by_free[most])), False)
