"""Heartbeat monitoring, one small abstraction used by both sides of a heartbeat.

`HeartbeatMonitor.monitor(target)` starts watching a target, `record(target)` notes a
heartbeat, `expired()` returns the targets silent for longer than the timeout (and stops
watching them). Interval and timeout are validated at construction (interval < timeout).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from shared.clock import Clock

Target = TypeVar("Target", bound=str)


class HeartbeatMonitor(Generic[Target]):
    """Generic in the kind of id it watches (e.g. HeartbeatMonitor[TaskManagerId])."""

    def __init__(self, clock: Clock, *, interval_s: float, timeout_s: float):
        if interval_s <= 0 or interval_s >= timeout_s:
            raise ValueError(f"heartbeat interval ({interval_s} s) must be > 0 and < timeout ({timeout_s} s)")
        self.clock, self.interval_s, self.timeout_s = clock, interval_s, timeout_s
        self._last: dict[Target, float] = {}

    def monitor(self, target: Target) -> None:
        self._last[target] = self.clock.now()

    def unmonitor(self, target: Target) -> None:
        self._last.pop(target, None)

    def record(self, target: Target) -> bool:
        """Returns False for a target that is not monitored (e.g. declared lost already)."""
        if target not in self._last:
            return False
        self._last[target] = self.clock.now()
        return True

    def last(self, target: Target) -> float | None:
        """When the target was last heard from (clock time), None if it is not watched."""
        return self._last.get(target)

    def silent(self) -> list[tuple[Target, float]]:
        """(target, last heard) of the targets silent for longer than the timeout; stops
        watching them."""
        now = self.clock.now()
        gone = [(t, last) for t, last in self._last.items() if now - last > self.timeout_s]
        for t, _ in gone:
            del self._last[t]
        return gone

    def expired(self) -> list[Target]:
        return [t for t, _ in self.silent()]
