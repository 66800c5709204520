"""Slot accounting: pure logic, no I/O, driven with a clock so it is unit-tested directly.

A task of parallelism p holds p slots on ONE TaskManager (the local engine runs its driver as
`local[p]`). Requests are served in submission order; a request that no registered TaskManager
could ever hold (p above every TaskManager's size) does not block the ones behind it, and fails
for good once the cluster has settled (unsatisfiable.py); what a waiting or timed-out request is
told is worded in slot_reasons.py. Allocation prefers a TaskManager with a ready warm driver that
fits the task (warm_drivers.py: ~1 s to start instead of 10+ s), then one whose warm driver is
still warming up with its session up, then spreads tasks over TaskManagers (the one with the most
free slots wins), so warm drivers on every TaskManager get used and a TaskManager loss hits as few
tasks as possible (free_slot_index.py finds it). The ready count is as fresh as the last
heartbeat; an allocation made here counts as taking one of its TaskManager's ready (or warming)
drivers until a report lists it, so a burst of tasks does not pile onto one warm driver.

Reconciliation: a TaskManager's slot report is the truth about what runs on it (this class
only believes what it was told). Registering (again) replaces the allocations held for it by
the ones it reports. Every heartbeat carries the report too, and `reconcile` repairs drift:
- held but not reported: freed, unless it is still in flight (made less than the grace period
  ago and never reported yet: its DeployTask may still be on the way);
- reported but not held: adopted. Releasing it would not stop the task, only hide it and let
  its slots be given away twice; whether the task should run is the JobManager's call (it
  cancels tasks it does not know when the TaskManager registers), and once the task ends the
  next report frees its slots. A report still listing an allocation the JobManager released a
  moment ago is older than the release and is not believed for `released_memory_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.resourcemanager.free_slot_index import READY, WARMING, FreeSlotIndex
from shared.clock import Clock
from shared.ids import AllocationId, ExecutionId, JobId, RequestId, TaskManagerId, new_allocation_id


@dataclass(frozen=True)
class Allocation:
    allocation_id: AllocationId
    taskmanager_id: TaskManagerId
    queue: str
    job_id: JobId
    execution_id: ExecutionId
    request_id: RequestId
    indices: tuple[int, ...]


@dataclass(frozen=True)
class SlotRequest:
    request_id: RequestId
    job_id: JobId
    execution_id: ExecutionId
    slots: int
    deadline: float
    seq: int = 0


@dataclass
class Drift:
    """What a slot report changed: allocations freed (held, not reported), adopted (reported,
    not held), and evicted (held on slots the report shows taken by another allocation)."""

    freed: list[Allocation] = field(default_factory=list)
    adopted: list[Allocation] = field(default_factory=list)
    evicted: list[Allocation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.freed or self.adopted or self.evicted)


@dataclass
class TaskManagerEntry:
    taskmanager_id: TaskManagerId
    queue: str
    host: str
    total: int
    cores: float
    memory_bytes: int
    slots: dict[int, AllocationId | None] = field(default_factory=dict)
    warm_ready: int = 0  # ready warm drivers, as of its last report
    warm_parallelism: int = 0
    warm_warming: int = 0  # warm drivers whose session is up, still warming up
    # Allocations placed here for a ready (or warming) warm driver that no report has listed yet.
    warm_taken: set[AllocationId] = field(default_factory=set)
    warming_taken: set[AllocationId] = field(default_factory=set)

    def free_indices(self) -> list[int]:
        return [i for i, a in sorted(self.slots.items()) if a is None]

    def ready_warm_drivers(self) -> int:
        return max(0, self.warm_ready - len(self.warm_taken))

    def warming_drivers(self) -> int:
        return max(0, self.warm_warming - len(self.warming_taken))


class SlotManager:
    """Every operation is O(1) or O(slots of one TaskManager) in the number of TaskManagers and
    pending requests: thousands of TaskManagers and requests are the normal case."""

    def __init__(self, clock: Clock, *, released_memory_s: float = 30.0):
        self.clock = clock
        self.released_memory_s = released_memory_s
        self.taskmanagers: dict[TaskManagerId, TaskManagerEntry] = {}
        self.allocations: dict[AllocationId, Allocation] = {}
        self.pending: dict[RequestId, SlotRequest] = {}  # insertion order = arrival order
        self._request_allocation: dict[RequestId, AllocationId] = {}
        self._free = FreeSlotIndex()  # where a request goes (free_slot_index.py)
        self._unconfirmed: dict[AllocationId, float] = {}  # made at; not reported by its TaskManager yet
        self._released: dict[AllocationId, float] = {}  # released by the JobManager at

    def largest_taskmanager(self) -> int:
        """The slot count of the largest registered TaskManager (0: none registered)."""
        return self._free.largest()

    # --- TaskManagers ------------------------------------------------------------------

    def register(
        self,
        *,
        taskmanager_id: TaskManagerId,
        queue: str,
        host: str,
        slots: int,
        cores: float,
        memory_bytes: int,
        occupied: dict[int, Allocation] | None = None,
    ) -> list[Allocation]:
        """(Re-)register. `occupied` is what the TaskManager reports it is running (slot index ->
        allocation): it replaces whatever was held for it, so a restarted ResourceManager learns
        allocations it never made and a returning TaskManager sheds the ones it no longer has.
        Returns the allocations dropped."""
        old = self.taskmanagers.get(taskmanager_id)
        dropped: list[Allocation] = []
        if old is not None:
            self._free.discard(old)
            reported = {a.allocation_id for a in (occupied or {}).values()}
            for alloc_id in {a for a in old.slots.values() if a}:
                alloc = self._forget(alloc_id)
                if alloc is not None and alloc_id not in reported:
                    dropped.append(alloc)
        entry = TaskManagerEntry(
            taskmanager_id, queue, host, slots, cores, memory_bytes, {i: None for i in range(slots)}
        )
        for i, alloc in (occupied or {}).items():
            if 0 <= i < slots:
                entry.slots[i] = alloc.allocation_id
                self.allocations[alloc.allocation_id] = alloc
        self.taskmanagers[taskmanager_id] = entry
        self._free.add(entry)
        return dropped

    def report_warm(self, taskmanager_id: TaskManagerId, *, ready: int, parallelism: int, warming: int = 0) -> None:
        """A TaskManager's ready warm drivers (and those still warming up with their session up),
        from its heartbeat or registration. Allocations still in flight (no report has listed
        them) keep counting as having taken a ready one."""
        entry = self.taskmanagers.get(taskmanager_id)
        if entry is None:
            return
        self._free.discard(entry)
        entry.warm_taken = {a for a in entry.warm_taken if a in self._unconfirmed}
        entry.warming_taken = {a for a in entry.warming_taken if a in self._unconfirmed}
        entry.warm_ready, entry.warm_parallelism = max(0, ready), parallelism
        entry.warm_warming = max(0, warming)
        self._free.add(entry)

    def reconcile(self, taskmanager_id: TaskManagerId, reported: dict[int, Allocation], *, grace_s: float) -> Drift:
        """Repair drift between what is held for a TaskManager and the slot report of its
        heartbeat (`reported`: slot index -> allocation); see the module docstring."""
        entry = self.taskmanagers.get(taskmanager_id)
        drift = Drift()
        if entry is None:
            return drift
        now = self.clock.now()
        by_id: dict[AllocationId, list[int]] = {}
        for i, alloc in reported.items():
            if 0 <= i < entry.total:
                by_id.setdefault(alloc.allocation_id, []).append(i)
        held = {a for a in entry.slots.values() if a}
        if held == set(by_id) and not any(a in self._unconfirmed for a in held):
            return drift  # the common case, in O(slots): nothing to repair
        self._free.discard(entry)
        for alloc_id in held - set(by_id):
            made = self._unconfirmed.get(alloc_id)
            if made is not None and now - made < grace_s:
                continue  # its deploy may still be on the way
            freed = self._forget(alloc_id)
            if freed is not None:
                drift.freed.append(freed)
        for alloc_id, indices in by_id.items():
            if alloc_id in held:
                self._unconfirmed.pop(alloc_id, None)  # the TaskManager has it: no longer in flight
                continue
            released = self._released.get(alloc_id)
            if released is not None and now - released < self.released_memory_s:
                continue  # a report from before the JobManager released it
            if alloc_id in self.allocations:
                continue  # held on another TaskManager: that one's report settles it
            for other in {entry.slots.get(i) for i in indices}:
                evicted = self._forget(other) if other is not None and other != alloc_id else None
                if evicted is not None:
                    drift.evicted.append(evicted)
            sample = reported[indices[0]]
            alloc = Allocation(
                alloc_id,
                taskmanager_id,
                entry.queue,
                sample.job_id,
                sample.execution_id,
                sample.request_id,
                tuple(sorted(indices)),
            )
            for i in alloc.indices:
                entry.slots[i] = alloc_id
            self.allocations[alloc_id] = alloc
            drift.adopted.append(alloc)
        self._free.add(entry)
        return drift

    def _forget(self, allocation_id: AllocationId) -> Allocation | None:
        """Drop an allocation and free its slots; the caller keeps the free-count index right."""
        alloc = self.allocations.pop(allocation_id, None)
        self._unconfirmed.pop(allocation_id, None)
        if alloc is None:
            return None
        self._request_allocation.pop(alloc.request_id, None)
        entry = self.taskmanagers.get(alloc.taskmanager_id)
        if entry is not None:
            for i in alloc.indices:
                if entry.slots.get(i) == allocation_id:
                    entry.slots[i] = None
        return alloc

    def remove(self, taskmanager_id: TaskManagerId) -> list[Allocation]:
        """The TaskManager is gone (lost or unregistered): its allocations die with it."""
        entry = self.taskmanagers.pop(taskmanager_id, None)
        if entry is None:
            return []
        self._free.discard(entry)
        lost = [self.allocations.pop(a) for a in set(entry.slots.values()) if a and a in self.allocations]
        for a in lost:
            self._request_allocation.pop(a.request_id, None)
            self._unconfirmed.pop(a.allocation_id, None)
        return lost

    # --- requests ----------------------------------------------------------------------

    def request(
        self,
        *,
        request_id: RequestId,
        job_id: JobId,
        execution_id: ExecutionId,
        slots: int,
        timeout_s: float,
        seq: int = 0,
    ) -> Allocation | None:
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

    def cancel_request(self, request_id: RequestId) -> bool:
        return self.pending.pop(request_id, None) is not None

    def release(self, allocation_id: AllocationId) -> Allocation | None:
        """The JobManager gives the slots back."""
        self._released[allocation_id] = self.clock.now()
        alloc = self.allocations.get(allocation_id)
        if alloc is None:
            return None
        entry = self.taskmanagers.get(alloc.taskmanager_id)
        if entry is not None:
            self._free.discard(entry)
        self._forget(allocation_id)
        if entry is not None:
            self._free.add(entry)
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

    def expire_pending(self) -> list[SlotRequest]:
        """Remove and return the pending requests past their deadline (slot_reasons.py says why)."""
        now = self.clock.now()
        if self._released:
            self._released = {a: t for a, t in self._released.items() if now - t < self.released_memory_s}
        expired = []
        for req in list(self.pending.values()):
            if now >= req.deadline:
                del self.pending[req.request_id]
                expired.append(req)
        return expired

    # --- reporting ---------------------------------------------------------------------

    def free_slots(self) -> int:
        return self._free.free_total()

    def total_slots(self) -> int:
        return sum(tm.total for tm in self.taskmanagers.values())

    def allocations_of(self, taskmanager_id: TaskManagerId) -> list[dict]:
        entry = self.taskmanagers.get(taskmanager_id)
        if entry is None:
            return []
        out = []
        for i, a in sorted(entry.slots.items()):
            if a is not None and a in self.allocations:
                alloc = self.allocations[a]
                out.append({"index": i, "allocation_id": a, "job_id": alloc.job_id, "execution_id": alloc.execution_id})
        return out

    # --- internals ---------------------------------------------------------------------

    def _could_ever_fit(self, req: SlotRequest) -> bool:
        return req.slots <= self._free.largest()

    def _blocking_ahead(self, req: SlotRequest) -> bool:
        return any(self._could_ever_fit(p) for p in self.pending.values())

    def _try_allocate(self, req: SlotRequest) -> Allocation | None:
        chosen = self._free.choose(req.slots)
        if chosen is None:
            return None
        tm_id, warm_kind = chosen
        tm = self.taskmanagers[tm_id]
        self._free.discard(tm)
        indices = tuple(tm.free_indices()[: req.slots])
        alloc = Allocation(
            new_allocation_id(), tm.taskmanager_id, tm.queue, req.job_id, req.execution_id, req.request_id, indices
        )
        for i in indices:
            tm.slots[i] = alloc.allocation_id
        if warm_kind == READY:
            tm.warm_taken.add(alloc.allocation_id)
        elif warm_kind == WARMING:
            tm.warming_taken.add(alloc.allocation_id)
        self._free.add(tm)
        self.allocations[alloc.allocation_id] = alloc
        self._request_allocation[req.request_id] = alloc.allocation_id
        self._unconfirmed[alloc.allocation_id] = self.clock.now()
        return alloc
