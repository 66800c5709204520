"""The ResourceManager's metrics: slots, TaskManagers and heartbeat lag, as it computes them for
hr:rm:stats once a second (loop_stats.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from shared import metrics


class ResourceManagerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, n = self.registry, metrics.name
        self.taskmanagers = Gauge(n("taskmanagers"), "registered TaskManagers", registry=r)
        self.slots_total = Gauge(n("slots_total"), "slots of the registered TaskManagers", registry=r)
        self.slots_free = Gauge(n("slots_free"), "slots not allocated to a task", registry=r)
        self.pending = Gauge(n("slot_requests_pending"), "slot requests waiting for free slots", registry=r)
        self.heartbeats = Gauge(n("heartbeats_per_second"), "TaskManager heartbeats received per second", registry=r)
        self.lag_max = Gauge(
            n("heartbeat_lag_max_seconds"),
            "longest send-to-handling delay of a heartbeat in the last second",
            registry=r,
        )
        self.lag_avg = Gauge(
            n("heartbeat_lag_avg_seconds"),
            "mean send-to-handling delay of the heartbeats in the last second",
            registry=r,
        )
        self.lost = Counter(n("taskmanagers_lost"), "TaskManagers declared lost since this process started", registry=r)
        self._lost_seen = 0
        self.refused = Counter(
            n("messages_refused"),
            "messages dead-lettered unread because their sender may not "
            "send them (unsigned, forged, another TaskManager's "
            "registration or heartbeat)",
            ["stream", "type"],
            registry=r,
        )

    def count_refused(self, stream: str, message_type: str) -> None:
        self.refused.labels(stream=stream, type=message_type).inc()

    def record(self, stats: dict) -> None:
        """Takes the dict the ResourceManager publishes to hr:rm:stats."""
        self.taskmanagers.set(stats.get("taskmanagers", 0))
        self.slots_total.set(stats.get("slots_total", 0))
        self.slots_free.set(stats.get("slots_free", 0))
        self.pending.set(stats.get("pending_requests", 0))
        self.heartbeats.set(stats.get("heartbeats_per_s", 0))
        self.lag_max.set(stats.get("heartbeat_lag_max_ms", 0) / 1000)
        self.lag_avg.set(stats.get("heartbeat_lag_avg_ms", 0) / 1000)
        lost = int(stats.get("taskmanagers_lost_total", 0))
        if lost > self._lost_seen:
            self.lost.inc(lost - self._lost_seen)
            self._lost_seen = lost
