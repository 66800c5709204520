"""Which TaskManager a request of p slots goes to, found without a scan over the TaskManagers
(slot_manager.py keeps it in step with every change to a TaskManager's slots).

A ready warm driver that fits first (warm_drivers.py), then one still warming up with its session
up (its task waits only for the warm-up to stop, not for a JVM and a SparkSession: 30-40 s at a
load of 12 on two cores), then the TaskManager with the most free slots (spreading). TaskManagers
are bucketed by free slot count, so a choice costs O(max slots), not O(TaskManagers); the count of
TaskManagers of each size gives the largest without a scan too (a scan per registration made
10,000 registrations quadratic).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from services.resourcemanager.warm_drivers import WarmDriverIndex
from shared.ids import TaskManagerId

# What a placement chose a TaskManager for: its ready warm driver, or one warming up.
READY, WARMING = "ready", "warming"

if TYPE_CHECKING:
    from services.resourcemanager.slot_manager import TaskManagerEntry


class FreeSlotIndex:
    """Holds each TaskManager as it was when added: remove it before its slots or warm drivers
    change and add it again after."""

    def __init__(self) -> None:
        self._by_free: dict[int, set[TaskManagerId]] = {}  # free slot count -> TaskManagers with that many
        self._warm = WarmDriverIndex()
        self._warming = WarmDriverIndex()  # a driver's session up, its warm-up still running
        self._free_total = 0
        self._totals: Counter[int] = Counter()  # slot total -> how many TaskManagers have it

    def add(self, entry: TaskManagerEntry) -> None:
        free = len(entry.free_indices())
        self._by_free.setdefault(free, set()).add(entry.taskmanager_id)
        if entry.ready_warm_drivers() > 0:
            self._warm.add(entry.taskmanager_id, free=free, parallelism=entry.warm_parallelism)
        if entry.warming_drivers() > 0:
            self._warming.add(entry.taskmanager_id, free=free, parallelism=entry.warm_parallelism)
        self._totals[entry.total] += 1
        self._free_total += free

    def discard(self, entry: TaskManagerEntry) -> None:
        free = len(entry.free_indices())
        self._by_free.setdefault(free, set()).discard(entry.taskmanager_id)
        if entry.ready_warm_drivers() > 0:
            self._warm.discard(entry.taskmanager_id, free=free, parallelism=entry.warm_parallelism)
        if entry.warming_drivers() > 0:
            self._warming.discard(entry.taskmanager_id, free=free, parallelism=entry.warm_parallelism)
        self._totals[entry.total] -= 1
        if self._totals[entry.total] <= 0:
            del self._totals[entry.total]
        self._free_total -= free

    def free_total(self) -> int:
        return self._free_total

    def largest(self) -> int:
        """The slot total of the largest TaskManager held (0: none)."""
        return max(self._totals, default=0)

    def choose(self, slots: int) -> tuple[TaskManagerId, str | None] | None:
        """(the TaskManager to hold `slots` slots, the warm driver it is chosen for: READY, WARMING
        or None), or None if none has that many free."""
        if slots > self._free_total:
            return None
        warm_id = self._warm.best_for(slots)
        if warm_id is not None:
            return warm_id, READY
        warming_id = self._warming.best_for(slots)
        if warming_id is not None:
            return warming_id, WARMING
        most = max((f for f, ids in self._by_free.items() if ids and f >= slots), default=None)
        return None if most is None else (next(iter(self._by_free[most])), None)
