"""Slot accounting: pure logic, no I/O, driven with a clock so it is unit-tested directly.

A task of parallelism p holds p slots on ONE TaskManager (the local engine runs its driver as
`local[p]`). Requests are served in submission order; a request that no registered
TaskManager could ever hold (p above every TaskManager's size) does not block the ones behind
it. Allocation spreads tasks over TaskManagers (the one with the most free slots wins), so warm
drivers on every TaskManager get used and a TaskManager loss hits as few tasks as possible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.clock import Clock
from shared.ids import new_allocation_id


@dataclass(frozen=True)
class Allocation:
    allocation_id: str
    taskmanager_id: str
    queue: str
    job_id: str
    execution_id: str
    request_id: str
    indices: tuple[int, ...]


@dataclass(frozen=True)
class SlotRequest:
    request_id: str
    job_id: str
    execution_id: str
    slots: int
    deadline: float
    seq: int = 0


@dataclass
class TaskManagerEntry:
    taskmanager_id: str
    queue: str
    host: str
    total: int
    cores: float
    memory_bytes: int
    slots: dict[int, str | None] = field(default_factory=dict)  # index -> allocation id

    def free_indices(self) -> list[int]:
        return [i for i, a in sorted(self.slots.items()) if a is None]


class SlotManager:
    """Every operation is O(1) or O(slots of one TaskManager) in the number of TaskManagers and
    pending requests: thousands of TaskManagers and requests are the normal case."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.taskmanagers: dict[str, TaskManagerEntry] = {}
        self.allocations: dict[str, Allocation] = {}
        self.pending: dict[str, SlotRequest] = {}  # insertion order = arrival order
        self._request_allocation: dict[str, str] = {}
        self._by_free: dict[int, set[str]] = {}  # free slot count -> TaskManagers with that many
        self._free_total = 0
        self._max_total = 0

    def _index(self, entry: TaskManagerEntry, delta_sign: int) -> None:
        """Add (+1) or remove (-1) a TaskManager from the free-count buckets and totals."""
        free = len(entry.free_indices())
        bucket = self._by_free.setdefault(free, set())
        if delta_sign > 0:
            bucket.add(entry.taskmanager_id)
        else:
            bucket.discard(entry.taskmanager_id)
        self._free_total += delta_sign * free

    def _refresh_max(self) -> None:
        self._max_total = max((tm.total for tm in self.taskmanagers.values()), default=0)

    # --- TaskManagers ------------------------------------------------------------------

    def register(self, *, taskmanager_id: str, queue: str, host: str, slots: int, cores: float,
                 memory_bytes: int, occupied: dict[int, Allocation] | None = None) -> None:
        """(Re-)register. `occupied` is what the TaskManager reports it is running, so a
        restarted ResourceManager learns allocations it never made."""
        old = self.taskmanagers.get(taskmanager_id)
        entry = TaskManagerEntry(taskmanager_id, queue, host, slots, cores, memory_bytes,
                                 {i: None for i in range(slots)})
        if old is not None:
            for i, alloc_id in old.slots.items():
                if alloc_id is not None and i < slots:
                    entry.slots[i] = alloc_id
        for i, alloc in (occupied or {}).items():
            if i < slots:
                entry.slots[i] = alloc.allocation_id
                self.allocations[alloc.allocation_id] = alloc
        if old is not None:
            self._index(old, -1)
        self.taskmanagers[taskmanager_id] = entry
        self._index(entry, +1)
        if slots > self._max_total or (old is not None and old.total == self._max_total):
            self._refresh_max()

    def remove(self, taskmanager_id: str) -> list[Allocation]:
        """The TaskManager is gone (lost or unregistered): its allocations die with it."""
        entry = self.taskmanagers.pop(taskmanager_id, None)
        if entry is None:
            return []
        self._index(entry, -1)
        if entry.total == self._max_total:
            self._refresh_max()
        lost = [self.allocations.pop(a) for a in set(entry.slots.values()) if a and a in self.allocations]
        for a in lost:
            self._request_allocation.pop(a.request_id, None)
        return lost

    # --- requests ----------------------------------------------------------------------

    def request(self, *, request_id: str, job_id: str, execution_id: str, slots: int, timeout_s: float,
                seq: int = 0) -> Allocation | None:
        """Allocate now if the queue is empty and something fits; else queue. Idempotent."""
        if request_id in self._request_allocation:
            return self.allocations.get(self._request_allocation[request_id])
        if request_id in self.pending:
            return None
        req = SlotRequest(request_id, job_id, execution_id, slots, self.clock.now() + timeout_s, seq)
        if not self._blocking_ahead(req):
            alloc = self._try_allocate(req)
            if alloc is not None:
                return alloc
        self.pending[request_id] = req
        return None

    def cancel_request(self, request_id: str) -> bool:
        return self.pending.pop(request_id, None) is not None

    def release(self, allocation_id: str) -> Allocation | None:
        alloc = self.allocations.pop(allocation_id, None)
        if alloc is None:
            return None
        self._request_allocation.pop(alloc.request_id, None)
        entry = self.taskmanagers.get(alloc.taskmanager_id)
        if entry is not None:
            self._index(entry, -1)
            for i in alloc.indices:
                if entry.slots.get(i) == allocation_id:
                    entry.slots[i] = None
            self._index(entry, +1)
        return alloc

    def serve_pending(self) -> list[tuple[SlotRequest, Allocation]]:
        """Allocate to waiting requests in arrival order; stops at the first one that could fit
        somewhere but not now, so later (smaller) requests never overtake it."""
        served = []
        for req in list(self.pending.values()):
            if not self._could_ever_fit(req):
                continue
            alloc = self._try_allocate(req)
            if alloc is None:
                break
            del self.pending[req.request_id]
            served.append((req, alloc))
        return served

    def expire_pending(self) -> list[tuple[SlotRequest, str]]:
        now = self.clock.now()
        expired = []
        for req in list(self.pending.values()):
            if now >= req.deadline:
                del self.pending[req.request_id]
                expired.append((req, self.timeout_message(req)))
        return expired

    # --- reporting ---------------------------------------------------------------------

    def free_slots(self) -> int:
        return self._free_total

    def total_slots(self) -> int:
        return sum(tm.total for tm in self.taskmanagers.values())

    def waiting_reason(self, request_id: str) -> str:
        req = self.pending[request_id]
        if next(reversed(self.pending)) == request_id:
            ahead = len(self.pending) - 1  # the common case: it was just queued
        else:
            ahead = list(self.pending).index(request_id)
        reason = f"waiting for {req.slots} slot{'s' if req.slots != 1 else ''}; {self.free_slots()} free"
        if not self._could_ever_fit(req):
            reason += f"; no TaskManager has {req.slots} slots (largest: {self._max_total})"
        elif ahead:
            reason += f"; {ahead} request{'s' if ahead != 1 else ''} ahead"
        return reason

    def timeout_message(self, req: SlotRequest) -> str:
        per_tm = ", ".join(f"{tm.taskmanager_id}: {len(tm.free_indices())}/{tm.total} free"
                           for tm in sorted(self.taskmanagers.values(), key=lambda t: t.taskmanager_id))
        return (
            f"could not allocate {req.slots} slot{'s' if req.slots != 1 else ''} on one TaskManager "
            f"for job {req.job_id} within the slot request timeout; {self.free_slots()} of "
            f"{self.total_slots()} slots free ({per_tm or 'no TaskManagers registered'})"
        )

    def allocations_of(self, taskmanager_id: str) -> list[dict]:
        entry = self.taskmanagers.get(taskmanager_id)
        if entry is None:
            return []
        out = []
        for i, a in sorted(entry.slots.items()):
            if a is not None and a in self.allocations:
                alloc = self.allocations[a]
                out.append({"index": i, "allocation_id": a, "job_id": alloc.job_id,
                            "execution_id": alloc.execution_id})
        return out

    # --- internals ---------------------------------------------------------------------

    def _could_ever_fit(self, req: SlotRequest) -> bool:
        return req.slots <= self._max_total

    def _blocking_ahead(self, req: SlotRequest) -> bool:
        return any(self._could_ever_fit(p) for p in self.pending.values())

    def _try_allocate(self, req: SlotRequest) -> Allocation | None:
        if req.slots > self._free_total:
            return None
        # The TaskManager with the most free slots (spreading); buckets make this O(max slots).
        for free in sorted((f for f, ids in self._by_free.items() if ids and f >= req.slots), reverse=True):
            tm = self.taskmanagers[next(iter(self._by_free[free]))]
            break
        else:
            return None
        self._index(tm, -1)
        indices = tuple(tm.free_indices()[: req.slots])
        alloc = Allocation(new_allocation_id(), tm.taskmanager_id, tm.queue, req.job_id, req.execution_id,
                           req.request_id, indices)
        for i in indices:
            tm.slots[i] = alloc.allocation_id
        self._index(tm, +1)
        self.allocations[alloc.allocation_id] = alloc
        self._request_allocation[req.request_id] = alloc.allocation_id
        return alloc
