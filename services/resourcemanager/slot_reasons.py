"""What the JobManager is told about a slot request that waits or times out: it shows it as the
attempt's and the job's waiting reason, or as the cause of the failure, so it says what was asked
and what the cluster has. Read from the SlotManager's public state; a request that can never be
served is worded in unsatisfiable.py."""

from __future__ import annotations

from services.resourcemanager.slot_manager import SlotManager, SlotRequest
from shared.ids import RequestId


def waiting_reason(slots: SlotManager, request_id: RequestId) -> str:
    """Why the pending request `request_id` waits."""
    req = slots.pending[request_id]
    if next(reversed(slots.pending)) == request_id:
        ahead = len(slots.pending) - 1  # the common case: it was just queued
    else:
        ahead = list(slots.pending).index(request_id)
    largest = slots.largest_taskmanager()
    if req.slots > largest:
        have = f"the largest has {largest}" if slots.taskmanagers else "none is registered"
        return (
            f"parallelism {req.slots} needs {req.slots} slots on one TaskManager; {have} "
            f"(no TaskManager has {req.slots} slots: waiting for one to register)"
        )
    reason = f"waiting for {req.slots} slot{'s' if req.slots != 1 else ''}; {slots.free_slots()} free"
    if ahead:
        reason += f"; {ahead} request{'s' if ahead != 1 else ''} ahead"
    return reason


def timeout_reason(slots: SlotManager, req: SlotRequest) -> str:
    """Why `req` failed at its deadline: what it asked for, and what each TaskManager had free."""
    per_tm = ", ".join(
        f"{tm.taskmanager_id}: {len(tm.free_indices())}/{tm.total} free"
        for tm in sorted(slots.taskmanagers.values(), key=lambda t: t.taskmanager_id)
    )
    return (
        f"could not allocate {req.slots} slot{'s' if req.slots != 1 else ''} on one TaskManager "
        f"for job {req.job_id} within the slot request timeout; {slots.free_slots()} of "
        f"{slots.total_slots()} slots free ({per_tm or 'no TaskManagers registered'})"
    )
