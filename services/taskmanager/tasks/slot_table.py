"""The slots of one TaskManager and the allocation holding each (None: free). Not thread-safe
on its own: the supervisor's lock guards it (supervisor.py)."""

from __future__ import annotations

from collections.abc import Iterable

from shared.ids import AllocationId


class SlotTable:
    def __init__(self, count: int) -> None:
        self._holders: dict[int, AllocationId | None] = {i: None for i in range(count)}

    def __len__(self) -> int:
        return len(self._holders)

    def taken_by_others(self, indices: Iterable[int], allocation_id: AllocationId) -> list[int]:
        """The slots of `indices` that are missing or held by another allocation."""
        return [i for i in indices if self._holders.get(i, "missing") not in (None, allocation_id)]

    def take(self, indices: Iterable[int], allocation_id: AllocationId) -> None:
        for i in indices:
            self._holders[i] = allocation_id

    def release(self, indices: Iterable[int], allocation_id: AllocationId) -> None:
        """Free the slots of `indices` that `allocation_id` still holds."""
        for i in indices:
            if self._holders.get(i) == allocation_id:
                self._holders[i] = None

    def free(self) -> int:
        return sum(1 for holder in self._holders.values() if holder is None)

    def holders(self) -> list[tuple[int, AllocationId | None]]:
        """(index, allocation or None) for every slot, by index."""
        return sorted(self._holders.items())
