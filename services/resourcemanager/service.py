"""The ResourceManager's event loop: it reads the streams, hands each message to the room that
answers it, runs the periodic scans and writes.

Everything runs on one thread: handlers mutate the SlotManager, replies are collected and sent
in one pipeline per batch (replies.py), the catalog is written in the periodic tick (catalog_sync.py:
one transaction for all TaskManagers whose slots changed), so 2,000 heartbeating TaskManagers cost
a few round trips per batch rather than a few per heartbeat. The rooms: which TaskManagers belong
to the cluster (membership.py), the JobManager's slot requests (slot_requests.py), slot accounting
(slot_manager.py), which JobManager is obeyed (fencing.py), the published figures (loop_stats.py).
"""

from __future__ import annotations

import logging
from typing import Callable

from services.resourcemanager.catalog_sync import TaskManagerCatalogSync
from services.resourcemanager.claims import RegistrationClaims
from services.resourcemanager.fencing import JobManagerFence
from services.resourcemanager.liveness import ConnectionLiveness
from services.resourcemanager.loop_stats import LoopStats
from services.resourcemanager.membership import TaskManagerMembership
from services.resourcemanager.replies import Replies
from services.resourcemanager.report_streams import ReportStreams
from services.resourcemanager.returning import ReturningTaskManagers
from services.resourcemanager.slot_manager import SlotManager
from services.resourcemanager.slot_requests import SlotRequests
from services.resourcemanager.unsatisfiable import UnsatisfiableRequests
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.clock import Clock
from shared.ids import new_message_id
from shared.messages import (
    CancelSlotRequest,
    Envelope,
    RegisterTaskManager,
    ReleaseSlots,
    RequestSlots,
    ResourceManagerStarted,
    TaskManagerHeartbeat,
    UnregisterTaskManager,
)
from shared.settings import Settings
from shared.transport.base import Transport

log = logging.getLogger("headrace.resourcemanager")


class ResourceManager:
    """`fence` decides which JobManager messages are obeyed (services/resourcemanager/fencing.py);
    None obeys every one, for tests and benchmarks that run without a leader."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        transport: Transport,
        clock: Clock,
        liveness: ConnectionLiveness | None = None,
        name: str = "resourcemanager",
        publish_stats: Callable[[dict], None] | None = None,
        announce: Callable[[str], None] | None = None,
        fence: JobManagerFence | None = None,
    ):
        self.settings, self.catalog, self.transport, self.clock = settings, catalog, transport, clock
        self.name = name
        self.fence = fence
        self.session = new_message_id()  # changes on every restart: TaskManagers re-register
        self.slots = SlotManager(clock)
        self.liveness = liveness
        self.replies = Replies()
        self.catalog_sync = TaskManagerCatalogSync(catalog, self.slots, clock)
        self.claims = RegistrationClaims(catalog, self.slots.allocations.get, transport.redis_client)
        self.reports = ReportStreams()  # the TaskManagers' own streams (report_streams.py)
        self.stats = LoopStats(clock, publish_stats)
        self.returning = ReturningTaskManagers(clock, timeout_s=settings.heartbeat_timeout_s)
        self.requests = SlotRequests(
            self.slots,
            UnsatisfiableRequests(clock, grace_s=settings.heartbeat_timeout_s),
            self.catalog_sync,
            self.replies,
        )
        self.members = TaskManagerMembership(
            settings,
            clock,
            session=self.session,
            slots=self.slots,
            requests=self.requests,
            catalog_sync=self.catalog_sync,
            claims=self.claims,
            returning=self.returning,
            stats=self.stats,
            replies=self.replies,
        )
        self._backlog = False
        self._last_scan = -1e9
        self._last_flush = 0.0
        self._last_liveness = 0.0
        self.stopping = False
        self.announce = announce
        self._last_announce = -1e9

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
        control = self.transport.poll(
            streams.RM_STREAM, streams.RM_GROUP, self.name, self.handle, count=self.BATCH, block_ms=0
        )
        self.flush_outbox()
        beats = self.transport.poll(
            streams.RM_HEARTBEAT_STREAM,
            streams.RM_GROUP,
            self.name,
            self.handle,
            count=self.BATCH,
            block_ms=0 if control else block_ms,
            also=self.reports.names(),
        )
        self._backlog = beats >= self.BATCH
        self.flush_outbox()
        return control + beats

    BATCH = 1000
    SCAN_INTERVAL_S = 0.25
    # CLIENT LIST every LIVENESS_INTERVAL_S (it lists every TaskManager's connection), and
    # LIVENESS_RECHECK_S after a name went missing: the second miss that makes it a death comes
    # 0.1 s after the first instead of 0.5 s, a killed TaskManager's task restarts that much sooner.
    LIVENESS_INTERVAL_S = 0.5
    LIVENESS_RECHECK_S = 0.1

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
            self.members.judge_silence()
        if self.liveness is not None and now - self._last_liveness >= (
            self.LIVENESS_RECHECK_S if self.liveness.suspected() else self.LIVENESS_INTERVAL_S
        ):
            self._last_liveness = now
            seen = self.liveness.look()
            self.reports.discover(seen[1])
            self.members.connections_closed(self.liveness.dead(self.members.connection_names(), seen))
        if scan:
            self.requests.fail_overdue()
        self.requests.serve_pending()
        if self.members.take_new_verdict():
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
            log.info(
                "waiting up to %g s for %d TaskManagers of the previous ResourceManager to register again",
                self.settings.heartbeat_timeout_s,
                waiting,
            )

    # --- handlers ----------------------------------------------------------------------

    def handle(self, env: Envelope) -> None:
        if self.fence is not None and not self.fence.admit(env):
            return
        self._dispatch(env)

    def _dispatch(self, env: Envelope) -> None:
        body = env.body
        if isinstance(body, TaskManagerHeartbeat):
            self.stats.heartbeat(env.sent_at)
            self.members.on_heartbeat(body)
        elif isinstance(body, RegisterTaskManager):
            self.members.on_register(env)
        elif isinstance(body, RequestSlots):
            self.requests.request(body)
        elif isinstance(body, ReleaseSlots):
            self.requests.release(body)
        elif isinstance(body, CancelSlotRequest):
            self.requests.cancel(body)
        elif isinstance(body, UnregisterTaskManager):
            self.members.lose(body.taskmanager_id, f"TaskManager unregistered: {body.reason}")
        else:
            log.warning("ResourceManager ignores %s", body.type)

    # --- output ------------------------------------------------------------------------

    def flush_outbox(self) -> None:
        self.replies.send(self.transport)

    def _flush_catalog_before_outbox(self, now: float) -> None:
        try:
            self._last_flush = now
            self.flush_catalog()
        except Exception as exc:  # noqa: BLE001 - kept for the next flush; the verdict still goes out
            log.warning("catalog write failed (%s); TaskManager verdicts are written on the next flush", exc)

    def flush_catalog(self) -> None:
        self.catalog_sync.flush()
        self.claims.flush()
