"""Which TaskManagers have a ready warm driver, for placement (free_slot_index.py).

A task placed where a warm driver is ready starts in about a second; one placed where the
warm-up has just begun (a TaskManager restarted after a kill comes back with every slot free)
waits 10+ s. Each heartbeat says how many drivers are ready and their parallelism; a driver
serves a task of parallelism p <= its own. Keyed by (free slots, driver parallelism), so the
best TaskManager is found in O(distinct keys), not O(TaskManagers). free_slot_index.py keeps a
second one for drivers still warming up whose session is up: the next best place.
"""

from __future__ import annotations

from shared.ids import TaskManagerId


class WarmDriverIndex:
    """TaskManagers with at least one ready warm driver nobody was just given, by (free, parallelism)."""

    def __init__(self) -> None:
        self._by_free_and_parallelism: dict[tuple[int, int], set[TaskManagerId]] = {}

    def add(self, taskmanager_id: TaskManagerId, *, free: int, parallelism: int) -> None:
        self._by_free_and_parallelism.setdefault((free, parallelism), set()).add(taskmanager_id)

    def discard(self, taskmanager_id: TaskManagerId, *, free: int, parallelism: int) -> None:
        key = (free, parallelism)
        bucket = self._by_free_and_parallelism.get(key)
        if bucket is None:
            return
        bucket.discard(taskmanager_id)
        if not bucket:
            del self._by_free_and_parallelism[key]

    def best_for(self, slots: int) -> TaskManagerId | None:
        """Among TaskManagers with `slots` free and a ready driver of parallelism >= `slots`, one
        with the most free slots (spreading, as without warm drivers); None if there is none."""
        fitting = [key for key in self._by_free_and_parallelism if key[0] >= slots and key[1] >= slots]
        if not fitting:
            return None
        return next(iter(self._by_free_and_parallelism[max(fitting)]))
