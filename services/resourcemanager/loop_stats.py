"""The figures the ResourceManager publishes to hr:rm:stats once a second (slots, TaskManagers,
heartbeat rate and lag; services/resourcemanager/metrics.py turns them into Prometheus metrics)
and the slot counts of the tasks each TaskManager runs (shared/standby_shape.py)."""

from __future__ import annotations

import time
from typing import Callable

from services.resourcemanager.slot_manager import SlotManager
from shared import standby_shape
from shared.clock import Clock


class LoopStats:
    PUBLISH_INTERVAL_S = 1.0

    def __init__(self, clock: Clock, publish: Callable[[dict], None] | None):
        self.clock, self.publish = clock, publish
        self.lost_total = 0
        self._heartbeats = 0
        self._max_lag_ms = 0.0
        self._lag_sum_ms = 0.0
        self._last_publish = 0.0

    def heartbeat(self, sent_at: float) -> None:
        """`sent_at`: the sender's wall-clock time (the envelope's)."""
        lag_ms = max(0.0, (time.time() - sent_at) * 1000)
        self._heartbeats += 1
        self._lag_sum_ms += lag_ms
        self._max_lag_ms = max(self._max_lag_ms, lag_ms)

    def taskmanager_lost(self) -> None:
        self.lost_total += 1

    def publish_due(self, now: float, slots: SlotManager) -> None:
        if self.publish is None or now - self._last_publish < self.PUBLISH_INTERVAL_S:
            return
        elapsed = max(1e-9, now - self._last_publish) if self._last_publish else 1.0
        beats = self._heartbeats
        self.publish(
            {
                "taskmanagers": len(slots.taskmanagers),
                "slots_total": slots.total_slots(),
                "slots_free": slots.free_slots(),
                "pending_requests": len(slots.pending),
                "heartbeats_per_s": round(beats / elapsed, 1),
                "heartbeat_lag_max_ms": round(self._max_lag_ms, 1),
                "heartbeat_lag_avg_ms": round(self._lag_sum_ms / beats, 1) if beats else 0.0,
                "taskmanagers_lost_total": self.lost_total,
                "at": time.time(),
                # What the TaskManagers' warm drivers take the shape of (shared/standby_shape.py).
                standby_shape.TASK_SLOTS: standby_shape.task_slots(slots.allocations.values()),
            }
        )
        self._last_publish = now
        self._heartbeats, self._max_lag_ms, self._lag_sum_ms = 0, 0.0, 0.0
