"""The JobManager's own watch over its slot requests (issue 43.8).

The slot request timeout runs in the ResourceManager, which answers every request at once
(`SlotsAllocated`, or `SlotRequestPending` with what it waits for) and fails it after
`slot.request.timeout`. A request the ResourceManager never saw (lost with a stream, or sent while
it was away and not asked again) had no timeout at all: its attempt stayed SCHEDULED, saying
nothing. So each request is watched here too:

- unanswered for UNANSWERED_S: the attempt's waiting reason says so, and the request is sent
  again (the ResourceManager treats a request id it knows as the same request);
- unanswered after the request's timeout: the attempt fails as the ResourceManager's timeout
  would have failed it (`NoResourceAvailableException`; its restart strategy decides);
- answered "pending" and still SCHEDULED a heartbeat timeout after the ResourceManager's own
  deadline: failed the same way (that answer was lost).

A request answered with slots or a failure is forgotten at once; the watch costs a heap entry per
request and touches the catalog only for a request that is overdue. A new leader watches the
requests it sends again for every SCHEDULED attempt (reconciliation.py).
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import Callable

from services.jobmanager.context import Context
from shared.catalog import repository as repo
from shared.clock import Clock
from shared.ids import ExecutionId
from shared.messages import CancelSlotRequest, RequestSlots
from shared.states import ExecutionState as ES

log = logging.getLogger("headrace.jobmanager")


@dataclass
class _Watch:
    request: RequestSlots
    first_sent: float
    pending_since: float | None = None  # answered "pending" at


class SlotRequestWatch:
    """`fail(execution id, cause)`: the restart room's failure of an attempt."""

    def __init__(self, ctx: Context, clock: Clock, fail: Callable[[ExecutionId, str], None]):
        self.ctx, self.clock, self.fail = ctx, clock, fail
        self.unanswered_s = ctx.settings.heartbeat_timeout_s
        self.grace_s = ctx.settings.heartbeat_timeout_s
        self._watches: dict[ExecutionId, _Watch] = {}
        self._heap: list[tuple[float, ExecutionId]] = []

    def sent(self, request: RequestSlots) -> None:
        """A request is (about to be) sent: watched from now, unless it is being watched."""
        if request.execution_id not in self._watches:
            self._watches[request.execution_id] = _Watch(request, self.clock.now())
            heapq.heappush(
                self._heap, (self.clock.now() + min(self.unanswered_s, request.timeout_s), request.execution_id)
            )

    def answered(self, execution_id: ExecutionId, *, pending: bool) -> None:
        watch = self._watches.get(execution_id)
        if watch is None:
            return
        if not pending:
            del self._watches[execution_id]  # its heap entry is skipped when it comes up
        elif watch.pending_since is None:
            watch.pending_since = self.clock.now()
            heapq.heappush(self._heap, (watch.first_sent + watch.request.timeout_s + self.grace_s, execution_id))

    def due(self) -> bool:
        while self._heap and self._heap[0][1] not in self._watches:
            heapq.heappop(self._heap)
        return bool(self._heap) and self._heap[0][0] <= self.clock.now()

    def tick(self) -> None:
        now = self.clock.now()
        while self._heap and self._heap[0][0] <= now:
            _, execution_id = heapq.heappop(self._heap)
            watch = self._watches.get(execution_id)
            if watch is not None:
                self._check(execution_id, watch, now)

    def _check(self, execution_id: ExecutionId, watch: _Watch, now: float) -> None:
        request = watch.request
        answered = watch.pending_since is not None
        deadline = watch.first_sent + request.timeout_s + (self.grace_s if answered else 0.0)
        if answered and now < deadline:
            return  # the ResourceManager knows it and runs its timeout; the entry at `deadline` follows
        with self.ctx.uow.tx() as s:
            try:
                ex = repo.get_execution(s, execution_id, lock=True)
            except repo.NotFound:
                ex = None
            if ex is None or ex.state != ES.SCHEDULED.value:
                del self._watches[execution_id]
                return
            waited = now - watch.first_sent
            if now < deadline:
                reason = (
                    f"the ResourceManager has not answered the request for {request.slots} slot"
                    f"{'s' if request.slots != 1 else ''} for {waited:.0f} s (it may be restarting or "
                    f"overloaded, or the request was lost); asked again"
                )
                repo.set_execution_waiting_reason(s, ex, reason)
                repo.set_job_waiting_reason(s, repo.get_job(s, ex.job_id, lock=True), reason)
                self.ctx.uow.emit(request)
                heapq.heappush(self._heap, (min(now + self.unanswered_s, deadline), execution_id))
                log.warning(
                    "slot request %s for %s unanswered for %.0f s: asking again",
                    request.request_id,
                    execution_id,
                    waited,
                )
                return
            del self._watches[execution_id]
            slots = f"{request.slots} slot{'s' if request.slots != 1 else ''}"
            cause = (
                f"could not get {slots} for job {request.job_id} within the slot request timeout "
                f"({request.timeout_s:g} s): "
                + (
                    f"the ResourceManager's own timeout did not arrive within {self.grace_s:g} s after it"
                    if answered
                    else "the ResourceManager never answered the request (it was down, or the request was lost)"
                )
            )
            log.warning("slot request %s: %s", request.request_id, cause)
            self.fail(execution_id, cause)
        self.ctx.uow.emit(CancelSlotRequest(request_id=request.request_id))
