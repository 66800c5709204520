"""What the catalog must learn about TaskManagers, kept in memory by the ResourceManager's
handlers and written in one transaction per flush (every 0.5 s, and at once before a verdict
goes out): 2,000 heartbeating TaskManagers then cost a few round trips per flush, not a few per
heartbeat. A flush that fails keeps everything for the next one (newer changes win)."""

from __future__ import annotations

from datetime import datetime, timezone

from services.resourcemanager.slot_manager import SlotManager
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.clock import Clock
from shared.ids import TaskManagerId
from shared.messages import RegisterTaskManager


class TaskManagerCatalogSync:
    # Heartbeat times are for display (timeSinceLastHeartbeat): every 2 s is plenty.
    HEARTBEAT_TIMES_FLUSH_S = 2.0

    def __init__(self, catalog: Catalog, slots: SlotManager, clock: Clock):
        self.catalog, self.slots, self.clock = catalog, slots, clock
        self._slots_changed: set[TaskManagerId] = set()
        self._heard_at: dict[TaskManagerId, datetime] = {}
        self._registrations: dict[TaskManagerId, RegisterTaskManager] = {}
        self._gone: dict[TaskManagerId, tuple[str, str]] = {}  # id -> (state, reason)
        # Unlike _gone, not dropped when the TaskManager registers again: its record keeps the loss.
        self._losses: dict[TaskManagerId, tuple[datetime, str]] = {}  # id -> (when, why)
        self._last_times_flush = -1e9

    def registered(self, msg: RegisterTaskManager) -> None:
        self._registrations[msg.taskmanager_id] = msg
        self._gone.pop(msg.taskmanager_id, None)

    def slots_changed(self, tm_id: TaskManagerId) -> None:
        self._slots_changed.add(tm_id)

    def heard_from(self, tm_id: TaskManagerId) -> None:
        self._heard_at[tm_id] = datetime.now(timezone.utc)

    def gone(self, tm_id: TaskManagerId, *, state: str, reason: str) -> None:
        self._registrations.pop(tm_id, None)
        self._gone[tm_id] = (state, reason)
        self._losses[tm_id] = (datetime.now(timezone.utc), reason)

    def flush(self) -> None:
        """One transaction for everything that changed since the last flush."""
        changed, self._slots_changed = self._slots_changed, set()
        heard: dict[TaskManagerId, datetime] = {}
        if self.clock.now() - self._last_times_flush >= self.HEARTBEAT_TIMES_FLUSH_S:
            self._last_times_flush = self.clock.now()
            heard, self._heard_at = self._heard_at, {}
        registrations, self._registrations = self._registrations, {}
        gone, self._gone = self._gone, {}
        losses, self._losses = self._losses, {}
        if not (changed or heard or registrations or gone or losses):
            return
        try:
            self._write(changed, heard, registrations, gone, losses)
        except Exception:
            # Catalog unreachable: keep every change for the next flush (newer ones win).
            self._slots_changed |= changed
            self._heard_at = heard | self._heard_at
            self._registrations = registrations | self._registrations
            self._gone = gone | self._gone
            self._losses = losses | self._losses
            raise

    def _write(
        self,
        changed: set[TaskManagerId],
        heard: dict[TaskManagerId, datetime],
        registrations: dict[TaskManagerId, RegisterTaskManager],
        gone: dict[TaskManagerId, tuple[str, str]],
        losses: dict[TaskManagerId, tuple[datetime, str]],
    ) -> None:
        with self.catalog.session() as s:
            rows = []
            for tm_id, msg in registrations.items():
                entry = self.slots.taskmanagers.get(tm_id)
                if entry is not None:
                    rows.append(
                        dict(
                            id=tm_id,
                            host=msg.host,
                            queue=msg.queue,
                            slots_total=msg.slots,
                            slots_free=len(entry.free_indices()),
                            cores=msg.cores,
                            memory_bytes=msg.memory_bytes,
                            allocations=self.slots.allocations_of(tm_id),
                        )
                    )
            repo.register_taskmanagers(s, rows)
            for tm_id, (state, reason) in gone.items():
                repo.mark_taskmanager_gone(s, tm_id, state=state, reason=reason)
            repo.record_taskmanager_losses(s, losses)
            slot_rows = []
            for tm_id in changed - set(registrations):
                entry = self.slots.taskmanagers.get(tm_id)
                if entry is not None:
                    slot_rows.append(
                        dict(
                            id=tm_id, slots_free=len(entry.free_indices()), allocations=self.slots.allocations_of(tm_id)
                        )
                    )
            repo.update_taskmanager_slots(s, slot_rows)
            repo.touch_taskmanagers(s, heard)
