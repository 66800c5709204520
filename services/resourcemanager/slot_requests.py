"""The JobManager's slot requests, as the ResourceManager answers them: allocated at once or told
why they wait (slot_reasons.py); allocated later, whenever slots free up or a TaskManager
registers; failed at their timeout, or for good once no TaskManager could ever hold them
(unsatisfiable.py). Every allocation marks its TaskManager's slots for the next catalog write.
The accounting itself is the SlotManager's (slot_manager.py)."""

from __future__ import annotations

import logging

from services.resourcemanager.catalog_sync import TaskManagerCatalogSync
from services.resourcemanager.replies import Replies
from services.resourcemanager.slot_manager import Allocation, SlotManager
from services.resourcemanager.slot_reasons import timeout_reason, waiting_reason
from services.resourcemanager.unsatisfiable import UnsatisfiableRequests
from shared.messages import (
    CancelSlotRequest,
    ReleaseSlots,
    RequestSlots,
    SlotRequestFailed,
    SlotRequestPending,
    SlotsAllocated,
)

log = logging.getLogger("headrace.resourcemanager")


class SlotRequests:
    def __init__(
        self,
        slots: SlotManager,
        unsatisfiable: UnsatisfiableRequests,
        catalog_sync: TaskManagerCatalogSync,
        replies: Replies,
    ):
        self.slots, self.unsatisfiable, self.catalog_sync, self.replies = slots, unsatisfiable, catalog_sync, replies

    def request(self, msg: RequestSlots) -> None:
        alloc = self.slots.request(
            request_id=msg.request_id,
            job_id=msg.job_id,
            execution_id=msg.execution_id,
            slots=msg.slots,
            timeout_s=msg.timeout_s,
            seq=msg.submitted_seq,
        )
        if alloc is not None:
            self._allocated(alloc)
        else:
            self.replies.to_jobmanager(
                SlotRequestPending(
                    request_id=msg.request_id,
                    execution_id=msg.execution_id,
                    job_id=msg.job_id,
                    reason=waiting_reason(self.slots, msg.request_id),
                )
            )

    def release(self, msg: ReleaseSlots) -> None:
        released = self.slots.release(msg.allocation_id)
        if released is not None:
            self.catalog_sync.slots_changed(released.taskmanager_id)
        self.serve_pending()

    def cancel(self, msg: CancelSlotRequest) -> None:
        self.slots.cancel_request(msg.request_id)

    def taskmanager_left(self) -> None:
        """A TaskManager was lost or unregistered: it may be restarting (see unsatisfiable.py)."""
        self.unsatisfiable.taskmanager_left()

    def serve_pending(self) -> None:
        for _req, alloc in self.slots.serve_pending():
            self._allocated(alloc)

    def fail_overdue(self) -> None:
        """Fail the requests past their timeout, then those no registered TaskManager could ever hold."""
        for req in self.slots.expire_pending():
            message = timeout_reason(self.slots, req)
            log.warning("slot request %s timed out: %s", req.request_id, message)
            self.replies.to_jobmanager(
                SlotRequestFailed(
                    request_id=req.request_id, execution_id=req.execution_id, job_id=req.job_id, reason=message
                )
            )
        for req, message in self.unsatisfiable.take(self.slots):
            log.warning("slot request %s can never be served: %s", req.request_id, message)
            self.replies.to_jobmanager(
                SlotRequestFailed(
                    request_id=req.request_id,
                    execution_id=req.execution_id,
                    job_id=req.job_id,
                    reason=message,
                    permanent=True,
                )
            )

    def _allocated(self, alloc: Allocation) -> None:
        self.catalog_sync.slots_changed(alloc.taskmanager_id)
        self.replies.to_jobmanager(
            SlotsAllocated(
                request_id=alloc.request_id,
                execution_id=alloc.execution_id,
                job_id=alloc.job_id,
                allocation_id=alloc.allocation_id,
                taskmanager_id=alloc.taskmanager_id,
                queue=alloc.queue,
                slot_indices=alloc.indices,
            )
        )
