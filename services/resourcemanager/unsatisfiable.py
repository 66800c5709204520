"""Slot requests no registered TaskManager could ever hold fail for good, instead of timing out.

A task of parallelism p holds p slots on one TaskManager (with a Spark standalone master too: the
slots are its TaskManager's, the executors come on top). A request for more slots than the
largest registered TaskManager has used to wait for `slot.request.timeout` (300 s), fail, and go
through the job's restart strategy, which asked again and waited again: 4 x 300 s for a job that
could never run. Now the ResourceManager says so once the cluster has had time to show itself:

  * not within `grace_s` (the heartbeat timeout) after the ResourceManager started: TaskManagers
    of a previous ResourceManager register again within that time, the larger ones among them;
  * not within `grace_s` after a TaskManager was lost or unregistered: it may be restarting;
  * not while no TaskManager is registered at all: a cluster still starting (or being replaced)
    is not one whose largest TaskManager is too small. Such requests time out as before.

Pure logic over the SlotManager's public state, driven by a clock, unit-tested directly.
"""

from __future__ import annotations

from services.resourcemanager.slot_manager import SlotManager, SlotRequest
from shared.clock import Clock

NAMES_SHOWN = 5


class UnsatisfiableRequests:
    def __init__(self, clock: Clock, *, grace_s: float):
        self.clock = clock
        self.grace_s = grace_s
        self._quiet_since = clock.now()  # the start, then the last loss of a TaskManager

    def taskmanager_left(self) -> None:
        self._quiet_since = self.clock.now()

    def settled(self) -> bool:
        return self.clock.now() - self._quiet_since >= self.grace_s

    def take(self, slots: SlotManager) -> list[tuple[SlotRequest, str]]:
        """Remove from `slots` the pending requests no registered TaskManager could ever hold,
        with the reason for each; none while the cluster is not settled (see the module doc)."""
        if not slots.pending or not slots.taskmanagers or not self.settled():
            return []
        largest = slots.largest_taskmanager()
        doomed = [req for req in slots.pending.values() if req.slots > largest]
        out = []
        for req in doomed:
            slots.cancel_request(req.request_id)
            out.append((req, permanent_reason(req, slots, largest)))
        return out


def permanent_reason(req: SlotRequest, slots: SlotManager, largest: int) -> str:
    names = sorted(tm.taskmanager_id for tm in slots.taskmanagers.values() if tm.total == largest)
    shown = ", ".join(names[:NAMES_SHOWN]) + (
        f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    )
    return (
        f"parallelism {req.slots} needs {req.slots} slots on one TaskManager; the largest registered "
        f"TaskManager has {largest} ({shown}; {len(slots.taskmanagers)} registered), so no restart can "
        f"help: resubmit with parallelism {largest} or less, or add a TaskManager with at least "
        f"{req.slots} slots (headrace taskmanager --slots {req.slots}) and submit again"
    )
