"""Which TaskManagers belong to the cluster, as the ResourceManager's handlers and scans decide it.

- A registration's slot report replaces what was held for it (slot_manager.py), with only what is
  its own to claim (claims.py). It is acknowledged, watched by its heartbeats and, when it names
  one, by its Redis connection (liveness.py), and the JobManager hears which tasks it runs.
- Every heartbeat carries the slot report too; drift from what is held is repaired and logged.
  A heartbeat from an unknown TaskManager (this ResourceManager restarted, or declared it lost)
  tells it to register again.
- A TaskManager is gone when it unregisters, when it is silent for the heartbeat timeout, when its
  connection closes, or when it does not register again within that timeout after a
  ResourceManager restart (returning.py). The verdict goes to the catalog (catalog_sync.py) and to
  the JobManager, with the allocations that died with it.
Slots freed or added on the way go to the waiting requests at once (slot_requests.py).
"""

from __future__ import annotations

import logging
import time

from services.resourcemanager.catalog_sync import TaskManagerCatalogSync
from services.resourcemanager.claims import RegistrationClaims
from services.resourcemanager.loop_stats import LoopStats
from services.resourcemanager.replies import Replies
from services.resourcemanager.returning import ReturningTaskManagers
from services.resourcemanager.slot_manager import Allocation, Drift, SlotManager
from services.resourcemanager.slot_requests import SlotRequests
from shared.clock import Clock
from shared.heartbeat import HeartbeatMonitor
from shared.ids import AllocationId, TaskManagerId, slot_request_id
from shared.messages import (
    Envelope,
    HeartbeatAck,
    RegisterTaskManager,
    SlotState,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskManagerRegistered,
)
from shared.settings import Settings

log = logging.getLogger("headrace.resourcemanager")


# An allocation its TaskManager has not reported yet is in flight (the JobManager's DeployTask
# is on its way) for this long before a heartbeat without it frees it: Celery drops a command
# after 60 s (shared/commands.py COMMAND_EXPIRES_S), plus two heartbeats to report it.
IN_FLIGHT_COMMAND_S = 60.0


class TaskManagerMembership:
    """`session`: the ResourceManager's, sent in every heartbeat ack."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        *,
        session: str,
        slots: SlotManager,
        requests: SlotRequests,
        catalog_sync: TaskManagerCatalogSync,
        claims: RegistrationClaims,
        returning: ReturningTaskManagers,
        stats: LoopStats,
        replies: Replies,
    ):
        self.settings, self.clock, self.session = settings, clock, session
        self.slots, self.requests, self.catalog_sync, self.claims = slots, requests, catalog_sync, claims
        self.returning, self.stats, self.replies = returning, stats, replies
        self.in_flight_grace_s = IN_FLIGHT_COMMAND_S + 2 * settings.heartbeat_interval_s
        self.heartbeats: HeartbeatMonitor[TaskManagerId] = HeartbeatMonitor(
            clock, interval_s=settings.heartbeat_interval_s, timeout_s=settings.heartbeat_timeout_s
        )
        self._connection_names: dict[TaskManagerId, str] = {}  # taskmanager id -> its liveness connection
        self._new_verdict = False

    # --- joining and heartbeats --------------------------------------------------------

    def on_register(self, env: Envelope) -> None:
        msg = env.body
        assert isinstance(msg, RegisterTaskManager)
        # Its slot report replaces what we held for it (see slot_manager.py), but only with what is
        # its own to claim (claims.py).
        occupied, refused = self.claims.allocations(
            env, reported_allocations(msg.taskmanager_id, msg.queue, msg.slot_report)
        )
        self.claims.endpoint(env)
        for alloc_id in {a.allocation_id for a in occupied.values()}:
            other = self.slots.allocations.get(alloc_id)
            if other is not None and other.taskmanager_id != msg.taskmanager_id:
                # The catalog places it here: the TaskManager holding it claimed it falsely.
                self.slots.release(alloc_id)
        dropped = self.slots.register(
            taskmanager_id=msg.taskmanager_id,
            queue=msg.queue,
            host=msg.host,
            slots=msg.slots,
            cores=msg.cores,
            memory_bytes=msg.memory_bytes,
            occupied=occupied,
        )
        self.slots.report_warm(
            msg.taskmanager_id, ready=msg.warm_ready, parallelism=msg.warm_parallelism, warming=msg.warm_warming
        )
        for alloc in dropped:
            log.warning(
                "TaskManager %s registered again without allocation %s (job %s, attempt %s): freed",
                msg.taskmanager_id,
                alloc.allocation_id,
                alloc.job_id,
                alloc.execution_id,
            )
        self.heartbeats.monitor(msg.taskmanager_id)
        if msg.liveness_name:
            self._connection_names[msg.taskmanager_id] = msg.liveness_name
        self.catalog_sync.registered(msg)
        self.returning.returned(msg.taskmanager_id)
        log.info(
            "TaskManager %s registered with %d slots (%d running)", msg.taskmanager_id, msg.slots, len(msg.running)
        )
        self.replies.to_taskmanager(
            msg.taskmanager_id, HeartbeatAck(taskmanager_id=msg.taskmanager_id, rm_session=self.session)
        )
        running = tuple(r for r in msg.running if r.allocation_id not in refused)
        self.replies.to_jobmanager(TaskManagerRegistered(taskmanager_id=msg.taskmanager_id, running=running))
        self.requests.serve_pending()

    def on_heartbeat(self, msg: TaskManagerHeartbeat) -> None:
        if self.heartbeats.record(msg.taskmanager_id):
            self.catalog_sync.heard_from(msg.taskmanager_id)
            entry = self.slots.taskmanagers.get(msg.taskmanager_id)
            if entry is not None:
                drift = self.slots.reconcile(
                    msg.taskmanager_id,
                    reported_allocations(msg.taskmanager_id, entry.queue, msg.slot_report),
                    grace_s=self.in_flight_grace_s,
                )
                self.slots.report_warm(
                    msg.taskmanager_id, ready=msg.warm_ready, parallelism=msg.warm_parallelism, warming=msg.warm_warming
                )
                if drift:
                    self._repaired(msg.taskmanager_id, drift)
            return
        # An unknown TaskManager (we restarted, or declared it lost) is told to register again.
        self.replies.to_taskmanager(
            msg.taskmanager_id, HeartbeatAck(taskmanager_id=msg.taskmanager_id, rm_session=self.session, known=False)
        )

    def _repaired(self, tm_id: TaskManagerId, drift: Drift) -> None:
        for alloc in drift.freed:
            log.warning(
                "allocation %s (job %s, attempt %s) is not in the slot report of %s: freed",
                alloc.allocation_id,
                alloc.job_id,
                alloc.execution_id,
                tm_id,
            )
        for alloc in drift.evicted:
            log.warning(
                "allocation %s (job %s, attempt %s) on %s lost its slots %s to a task the TaskManager "
                "reports running: freed",
                alloc.allocation_id,
                alloc.job_id,
                alloc.execution_id,
                tm_id,
                list(alloc.indices),
            )
        for alloc in drift.adopted:
            log.warning(
                "adopting allocation %s (job %s, attempt %s) on slots %s of %s: the TaskManager reports it "
                "and we did not hold it",
                alloc.allocation_id,
                alloc.job_id,
                alloc.execution_id,
                list(alloc.indices),
                tm_id,
            )
        self.catalog_sync.slots_changed(tm_id)
        self.requests.serve_pending()

    # --- losses ------------------------------------------------------------------------

    def judge_silence(self) -> None:
        """Declare gone those not back after a ResourceManager restart and those silent for the
        heartbeat timeout. Only with the streams drained: a heartbeat still queued is not silence."""
        for tm_id in self.returning.overdue():
            # Its allocations died with the previous ResourceManager's memory; the JobManager
            # fails whatever the catalog says still runs there.
            self._declare_gone(
                tm_id,
                f"TaskManager lost: it did not register again within "
                f"{self.settings.heartbeat_timeout_s:g} s after the ResourceManager "
                f"restarted",
                (),
            )
        for tm_id, last in self.heartbeats.silent():
            self.lose(
                tm_id, f"TaskManager lost: no heartbeat for {self.settings.heartbeat_timeout_s:g} s", last_heard=last
            )

    def connection_names(self) -> set[str]:
        """The liveness connections of the registered TaskManagers that named one."""
        return set(self._connection_names.values())

    def connections_closed(self, names: set[str]) -> None:
        for name in names:
            for tm_id in [t for t, n in self._connection_names.items() if n == name]:
                self.lose(tm_id, "TaskManager lost: its process exited (connection closed)")

    def lose(self, tm_id: TaskManagerId, reason: str, last_heard: float | None = None) -> None:
        last_heard = last_heard if last_heard is not None else self.heartbeats.last(tm_id)
        self.heartbeats.unmonitor(tm_id)
        self._connection_names.pop(tm_id, None)
        if tm_id not in self.slots.taskmanagers:
            if self.returning.returned(tm_id):
                self._declare_gone(tm_id, reason, ())  # e.g. it unregistered while we were down
            return
        lost = self.slots.remove(tm_id)
        self.requests.taskmanager_left()
        silent = None if last_heard is None else max(0.0, self.clock.now() - last_heard)
        heard_at = None if silent is None else time.time() - silent
        self._declare_gone(tm_id, reason, tuple(a.allocation_id for a in lost), heard_at, silent)
        self.requests.serve_pending()

    def _declare_gone(
        self,
        tm_id: TaskManagerId,
        reason: str,
        allocations: tuple[AllocationId, ...],
        last_heard_at: float | None = None,
        silent_for_s: float | None = None,
    ) -> None:
        log.warning("%s (%s); %d allocations lost", reason, tm_id, len(allocations))
        self.stats.taskmanager_lost()
        self.catalog_sync.gone(tm_id, state="UNREGISTERED" if "unregistered" in reason else "LOST", reason=reason)
        self.claims.gone(tm_id)
        self._new_verdict = True
        self.replies.to_jobmanager(
            TaskManagerLost(
                taskmanager_id=tm_id,
                reason=reason,
                allocations=allocations,
                last_heard_at=last_heard_at,
                silent_for_s=silent_for_s,
            )
        )

    def take_new_verdict(self) -> bool:
        """Whether a TaskManager was declared gone since the last call: the ResourceManager then
        writes the catalog before it sends the verdict, once per verdict (while the catalog is
        down, its periodic flush retries, not every tick)."""
        new, self._new_verdict = self._new_verdict, False
        return new


def reported_allocations(tm_id: TaskManagerId, queue: str, report: tuple[SlotState, ...]) -> dict[int, Allocation]:
    """A slot report as slot index -> allocation; the slots of one allocation, reported one by
    one, are merged back into one allocation."""
    indices: dict[AllocationId, list[int]] = {}
    first: dict[AllocationId, SlotState] = {}
    for s in report:
        if s.allocation_id and s.job_id and s.execution_id:
            indices.setdefault(s.allocation_id, []).append(s.index)
            first.setdefault(s.allocation_id, s)
    out: dict[int, Allocation] = {}
    for alloc_id, idx in indices.items():
        s = first[alloc_id]
        job_id, execution_id = s.job_id, s.execution_id
        assert job_id is not None and execution_id is not None  # only such slots were collected
        alloc = Allocation(
            alloc_id, tm_id, queue, job_id, execution_id, slot_request_id(execution_id), tuple(sorted(idx))
        )
        out.update(dict.fromkeys(idx, alloc))
    return out
