"""The ResourceManager's event loop: registrations, heartbeats, slot requests and releases.

Everything runs on one thread: handlers mutate the SlotManager, replies are collected and sent
in one pipeline per batch, the catalog is written in the periodic tick (catalog_sync.py: one
transaction for all TaskManagers whose slots changed), so 2,000 heartbeating TaskManagers cost a
few round trips per batch rather than a few per heartbeat. The other rooms: slot accounting
(slot_manager.py), requests that can never be served (unsatisfiable.py), which JobManager is
obeyed (fencing.py), the published figures (loop_stats.py).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from services.resourcemanager.catalog_sync import TaskManagerCatalogSync
from services.resourcemanager.claims import RegistrationClaims
from services.resourcemanager.fencing import JobManagerFence
from services.resourcemanager.liveness import ConnectionLiveness
from services.resourcemanager.loop_stats import LoopStats
from services.resourcemanager.report_streams import ReportStreams
from services.resourcemanager.returning import ReturningTaskManagers
from services.resourcemanager.slot_manager import Allocation, Drift, SlotManager
from services.resourcemanager.slot_reasons import timeout_reason, waiting_reason
from services.resourcemanager.unsatisfiable import UnsatisfiableRequests
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.clock import Clock
from shared.heartbeat import HeartbeatMonitor
from shared.ids import AllocationId, TaskManagerId, new_message_id, slot_request_id
from shared.messages import (
    CancelSlotRequest,
    Envelope,
    HeartbeatAck,
    Message,
    RegisterTaskManager,
    ReleaseSlots,
    RequestSlots,
    ResourceManagerStarted,
    SlotRequestFailed,
    SlotRequestPending,
    SlotsAllocated,
    SlotState,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskManagerRegistered,
    UnregisterTaskManager,
)
from shared.settings import Settings
from shared.transport.base import Transport

log = logging.getLogger("headrace.resourcemanager")


# An allocation its TaskManager has not reported yet is in flight (the JobManager's DeployTask
# is on its way) for this long before a heartbeat without it frees it: Celery drops a command
# after 60 s (shared/commands.py COMMAND_EXPIRES_S), plus two heartbeats to report it.
IN_FLIGHT_COMMAND_S = 60.0


class ResourceManager:
    """`fence` decides which JobManager messages are obeyed (services/resourcemanager/fencing.py);
    None obeys every one, for tests and benchmarks that run without a leader."""

    def __init__(self, settings: Settings, catalog: Catalog, transport: Transport, clock: Clock,
                 liveness: ConnectionLiveness | None = None, name: str = "resourcemanager",
                 publish_stats: Callable[[dict], None] | None = None,
                 announce: Callable[[str], None] | None = None, fence: JobManagerFence | None = None):
        self.settings, self.catalog, self.transport, self.clock = settings, catalog, transport, clock
        self.name = name
        self.fence = fence
        self.in_flight_grace_s = IN_FLIGHT_COMMAND_S + 2 * settings.heartbeat_interval_s
        self.session = new_message_id()  # changes on every restart: TaskManagers re-register
        self.slots = SlotManager(clock)
        self.unsatisfiable = UnsatisfiableRequests(clock, grace_s=settings.heartbeat_timeout_s)
        self.heartbeats: HeartbeatMonitor[TaskManagerId] = HeartbeatMonitor(
            clock, interval_s=settings.heartbeat_interval_s, timeout_s=settings.heartbeat_timeout_s)
        self.liveness = liveness
        self._liveness_names: dict[TaskManagerId, str] = {}  # taskmanager id -> connection name
        self._outbox: list[tuple[str, object]] = []
        self.catalog_sync = TaskManagerCatalogSync(catalog, self.slots, clock)
        self.claims = RegistrationClaims(catalog, self.slots.allocations.get, transport.redis_client)
        self.reports = ReportStreams()  # the TaskManagers' own streams (report_streams.py)
        self.stats = LoopStats(clock, publish_stats)
        # A verdict made since the last early flush: written before it is sent (see tick). Only
        # once per verdict: while the catalog is down, the periodic flush retries, not every tick.
        self._new_verdict = False
        self._backlog = False
        self._last_scan = -1e9
        self._last_flush = 0.0
        self._last_liveness = 0.0
        self.stopping = False
        self.announce = announce
        self._last_announce = -1e9
        self.returning = ReturningTaskManagers(clock, timeout_s=settings.heartbeat_timeout_s)

    # --- loop --------------------------------------------------------------------------

    def run(self) -> None:
        log.info("ResourceManager %s started (session %s)", self.name, self.session)
        if not self.returning.expected:
            self.adopt_previous_taskmanagers()
        self.transport.publish(streams.JM_STREAM, ResourceManagerStarted(rm_session=self.session))
        while not self.stopping:
            self.poll_once(block_ms=100)
            self.tick()

    def poll_once(self, block_ms: int = 100) -> int:
        """Control messages first (slot requests), then the TaskManagers' registrations and
        heartbeats, each on its own stream: a heartbeat backlog must never delay an allocation.
        Blocks only when there was no control work. (hr:stream:rm:heartbeats carries heartbeats
        only from processes that hold the cluster secret: benchmarks and tests.)"""
        control = self.transport.poll(streams.RM_STREAM, streams.RM_GROUP, self.name, self.handle,
                                      count=self.BATCH, block_ms=0)
        self.flush_outbox()
        beats = self.transport.poll(streams.RM_HEARTBEAT_STREAM, streams.RM_GROUP, self.name, self.handle,
                                    count=self.BATCH, block_ms=0 if control else block_ms, also=self.reports.names())
        self._backlog = beats >= self.BATCH
        self.flush_outbox()
        return control + beats

    BATCH = 1000
    SCAN_INTERVAL_S = 0.25

    def tick(self) -> None:
        now = self.clock.now()
        if self.fence is not None and self.fence.held:
            for env in self.fence.release():
                self._dispatch(env)
        if self.announce is not None and now - self._last_announce >= self.settings.heartbeat_interval_s / 2:
            # The ResourceManager's half of the heartbeat, to every TaskManager at once.
            self.announce(self.session)
            self._last_announce = now
        # Silence is judged only with the stream drained: heartbeats still queued behind our own
        # backlog are not silence, and declaring their senders lost would be a false verdict.
        # Scans over every TaskManager and request run a few times a second, not after every
        # poll: with thousands of each, scanning per poll would cost more than the heartbeats.
        scan = now - self._last_scan >= self.SCAN_INTERVAL_S
        if scan:
            self._last_scan = now
        if scan and not self._backlog:
            for tm_id in self.returning.overdue():
                # Its allocations died with the previous ResourceManager's memory; the JobManager
                # fails whatever the catalog says still runs there.
                self._declare_gone(tm_id, f"TaskManager lost: it did not register again within "
                                          f"{self.settings.heartbeat_timeout_s:g} s after the ResourceManager "
                                          f"restarted", ())
            for tm_id, last in self.heartbeats.silent():
                self._lose(tm_id, f"TaskManager lost: no heartbeat for {self.settings.heartbeat_timeout_s:g} s",
                           last_heard=last)
        if self.liveness is not None and now - self._last_liveness >= 0.5:
            self._last_liveness = now
            seen = self.liveness.look()
            self.reports.discover(seen[1])
            watched = {name for name in self._liveness_names.values()}
            for name in self.liveness.dead(watched, seen):
                for tm_id in [t for t, n in self._liveness_names.items() if n == name]:
                    self._lose(tm_id, "TaskManager lost: its process exited (connection closed)")
        for req in (self.slots.expire_pending() if scan else ()):
            message = timeout_reason(self.slots, req)
            log.warning("slot request %s timed out: %s", req.request_id, message)
            self._send_jm(SlotRequestFailed(request_id=req.request_id, execution_id=req.execution_id,
                                            job_id=req.job_id, reason=message))
        for req, message in (self.unsatisfiable.take(self.slots) if scan else ()):
            log.warning("slot request %s can never be served: %s", req.request_id, message)
            self._send_jm(SlotRequestFailed(request_id=req.request_id, execution_id=req.execution_id,
                                            job_id=req.job_id, reason=message, permanent=True))
        self._serve_pending()
        if self._new_verdict:
            self._new_verdict = False
            # A verdict reaches the catalog before the JobManager acts on it: whoever sees the
            # task moved (GET /taskmanagers/{id}, the dashboard) also sees its TaskManager LOST.
            self._flush_catalog_before_outbox(now)
        self.flush_outbox()
        if now - self._last_flush >= 0.5:
            self._last_flush = now
            self.flush_catalog()
        self.stats.publish_due(now, self.slots)

    def adopt_previous_taskmanagers(self) -> None:
        """Give each TaskManager the previous ResourceManager had registered heartbeat timeout
        to register again (returning.py)."""
        self.reports.load(self.catalog)
        with self.catalog.session() as s:
            previous = [tm.id for tm in repo.list_taskmanagers(s)]
        waiting = self.returning.expect(previous, self.slots.taskmanagers)
        if waiting:
            log.info("waiting up to %g s for %d TaskManagers of the previous ResourceManager to register again",
                     self.settings.heartbeat_timeout_s, waiting)

    # --- handlers ----------------------------------------------------------------------

    def handle(self, env: Envelope) -> None:
        if self.fence is not None and not self.fence.admit(env):
            return
        self._dispatch(env)

    def _dispatch(self, env: Envelope) -> None:
        body = env.body
        if isinstance(body, TaskManagerHeartbeat):
            self.stats.heartbeat(env.sent_at)
            self._on_heartbeat(body)
        elif isinstance(body, RegisterTaskManager):
            self._on_register(env)
        elif isinstance(body, RequestSlots):
            self._on_request(body)
        elif isinstance(body, ReleaseSlots):
            released = self.slots.release(body.allocation_id)
            if released is not None:
                self.catalog_sync.slots_changed(released.taskmanager_id)
            self._serve_pending()
        elif isinstance(body, CancelSlotRequest):
            self.slots.cancel_request(body.request_id)
        elif isinstance(body, UnregisterTaskManager):
            self._lose(body.taskmanager_id, f"TaskManager unregistered: {body.reason}")
        else:
            log.warning("ResourceManager ignores %s", body.type)

    def _on_register(self, env: Envelope) -> None:
        msg = env.body
        assert isinstance(msg, RegisterTaskManager)
        # Its slot report replaces what we held for it (see slot_manager.py), but only with what is
        # its own to claim (claims.py).
        occupied, refused = self.claims.allocations(
            env, reported_allocations(msg.taskmanager_id, msg.queue, msg.slot_report))
        self.claims.endpoint(env)
        for alloc_id in {a.allocation_id for a in occupied.values()}:
            other = self.slots.allocations.get(alloc_id)
            if other is not None and other.taskmanager_id != msg.taskmanager_id:
                # The catalog places it here: the TaskManager holding it claimed it falsely.
                self.slots.release(alloc_id)
        dropped = self.slots.register(taskmanager_id=msg.taskmanager_id, queue=msg.queue, host=msg.host,
                                      slots=msg.slots, cores=msg.cores, memory_bytes=msg.memory_bytes,
                                      occupied=occupied)
        self.slots.report_warm(msg.taskmanager_id, ready=msg.warm_ready, parallelism=msg.warm_parallelism)
        for alloc in dropped:
            log.warning("TaskManager %s registered again without allocation %s (job %s, attempt %s): freed",
                        msg.taskmanager_id, alloc.allocation_id, alloc.job_id, alloc.execution_id)
        self.heartbeats.monitor(msg.taskmanager_id)
        if msg.liveness_name:
            self._liveness_names[msg.taskmanager_id] = msg.liveness_name
        self.catalog_sync.registered(msg)
        self.returning.returned(msg.taskmanager_id)
        log.info("TaskManager %s registered with %d slots (%d running)", msg.taskmanager_id, msg.slots,
                 len(msg.running))
        self._outbox.append((streams.tm_inbox(msg.taskmanager_id),
                             HeartbeatAck(taskmanager_id=msg.taskmanager_id, rm_session=self.session)))
        running = tuple(r for r in msg.running if r.allocation_id not in refused)
        self._send_jm(TaskManagerRegistered(taskmanager_id=msg.taskmanager_id, running=running))
        self._serve_pending()

    def _on_heartbeat(self, msg: TaskManagerHeartbeat) -> None:
        if self.heartbeats.record(msg.taskmanager_id):
            self.catalog_sync.heard_from(msg.taskmanager_id)
            entry = self.slots.taskmanagers.get(msg.taskmanager_id)
            if entry is not None:
                drift = self.slots.reconcile(msg.taskmanager_id,
                                             reported_allocations(msg.taskmanager_id, entry.queue, msg.slot_report),
                                             grace_s=self.in_flight_grace_s)
                self.slots.report_warm(msg.taskmanager_id, ready=msg.warm_ready, parallelism=msg.warm_parallelism)
                if drift:
                    self._repaired(msg.taskmanager_id, drift)
            return
        # An unknown TaskManager (we restarted, or declared it lost) is told to register again.
        self._outbox.append((streams.tm_inbox(msg.taskmanager_id),
                             HeartbeatAck(taskmanager_id=msg.taskmanager_id, rm_session=self.session, known=False)))

    def _repaired(self, tm_id: TaskManagerId, drift: Drift) -> None:
        for alloc in drift.freed:
            log.warning("allocation %s (job %s, attempt %s) is not in the slot report of %s: freed",
                        alloc.allocation_id, alloc.job_id, alloc.execution_id, tm_id)
        for alloc in drift.evicted:
            log.warning("allocation %s (job %s, attempt %s) on %s lost its slots %s to a task the TaskManager "
                        "reports running: freed", alloc.allocation_id, alloc.job_id, alloc.execution_id, tm_id,
                        list(alloc.indices))
        for alloc in drift.adopted:
            log.warning("adopting allocation %s (job %s, attempt %s) on slots %s of %s: the TaskManager reports it "
                        "and we did not hold it", alloc.allocation_id, alloc.job_id, alloc.execution_id,
                        list(alloc.indices), tm_id)
        self.catalog_sync.slots_changed(tm_id)
        self._serve_pending()

    def _on_request(self, msg: RequestSlots) -> None:
        alloc = self.slots.request(request_id=msg.request_id, job_id=msg.job_id, execution_id=msg.execution_id,
                                   slots=msg.slots, timeout_s=msg.timeout_s, seq=msg.submitted_seq)
        if alloc is not None:
            self._allocated(alloc)
        else:
            self._send_jm(SlotRequestPending(request_id=msg.request_id, execution_id=msg.execution_id,
                                             job_id=msg.job_id, reason=waiting_reason(self.slots, msg.request_id)))

    def _serve_pending(self) -> None:
        for _req, alloc in self.slots.serve_pending():
            self._allocated(alloc)

    def _allocated(self, alloc: Allocation) -> None:
        self.catalog_sync.slots_changed(alloc.taskmanager_id)
        self._send_jm(SlotsAllocated(request_id=alloc.request_id, execution_id=alloc.execution_id,
                                     job_id=alloc.job_id, allocation_id=alloc.allocation_id,
                                     taskmanager_id=alloc.taskmanager_id, queue=alloc.queue,
                                     slot_indices=alloc.indices))

    def _lose(self, tm_id: TaskManagerId, reason: str, last_heard: float | None = None) -> None:
        last_heard = last_heard if last_heard is not None else self.heartbeats.last(tm_id)
        self.heartbeats.unmonitor(tm_id)
        self._liveness_names.pop(tm_id, None)
        if tm_id not in self.slots.taskmanagers:
            if self.returning.returned(tm_id):
                self._declare_gone(tm_id, reason, ())  # e.g. it unregistered while we were down
            return
        lost = self.slots.remove(tm_id)
        self.unsatisfiable.taskmanager_left()
        silent = None if last_heard is None else max(0.0, self.clock.now() - last_heard)
        heard_at = None if silent is None else time.time() - silent
        self._declare_gone(tm_id, reason, tuple(a.allocation_id for a in lost), heard_at, silent)
        self._serve_pending()

    def _declare_gone(self, tm_id: TaskManagerId, reason: str, allocations: tuple[AllocationId, ...],
                      last_heard_at: float | None = None, silent_for_s: float | None = None) -> None:
        log.warning("%s (%s); %d allocations lost", reason, tm_id, len(allocations))
        self.stats.taskmanager_lost()
        self.catalog_sync.gone(tm_id, state="UNREGISTERED" if "unregistered" in reason else "LOST", reason=reason)
        self.claims.gone(tm_id)
        self._new_verdict = True
        self._send_jm(TaskManagerLost(taskmanager_id=tm_id, reason=reason, allocations=allocations,
                                      last_heard_at=last_heard_at, silent_for_s=silent_for_s))

    def _send_jm(self, body: Message) -> None:
        self._outbox.append((streams.JM_STREAM, body))

    # --- output ------------------------------------------------------------------------

    def flush_outbox(self) -> None:
        if self._outbox:
            items, self._outbox = self._outbox, []
            try:
                self.transport.publish_many(items)
            except Exception:
                # The messages that caused these were acknowledged already: keep the answers
                # (an allocation the JobManager never hears of would hold its slots forever).
                self._outbox = items + self._outbox
                raise

    def _flush_catalog_before_outbox(self, now: float) -> None:
        try:
            self._last_flush = now
            self.flush_catalog()
        except Exception as exc:  # noqa: BLE001 - kept for the next flush; the verdict still goes out
            log.warning("catalog write failed (%s); TaskManager verdicts are written on the next flush", exc)

    def flush_catalog(self) -> None:
        self.catalog_sync.flush()
        self.claims.flush()


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
        alloc = Allocation(alloc_id, tm_id, queue, job_id, execution_id, slot_request_id(execution_id),
                           tuple(sorted(idx)))
        out.update(dict.fromkeys(idx, alloc))
    return out
