"""Warm Spark drivers for free slots.

A cold driver costs ~10 s before its first query (JVM start, SparkContext, Python workers); a
warm one has paid that already, so a submission or a failover starts in about a second. The
pool keeps up to `size` drivers of `parallelism` ready, never more than the free slots could
use, hands the oldest healthy one out, and starts a replacement in the background. A driver
that died, never became ready within `ready_timeout_s`, or grew past `max_rss_bytes` is
discarded, never given a task.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import psutil

from services.taskmanager.driver_process import DriverProcess

log = logging.getLogger("headrace.taskmanager.warm")


class WarmPool:
    def __init__(self, *, size: int, parallelism: int, factory: Callable[[int], DriverProcess],
                 max_rss_bytes: int | None = None, ready_timeout_s: float = 120.0):
        self.size, self.parallelism, self.factory = size, parallelism, factory
        self.max_rss_bytes, self.ready_timeout_s = max_rss_bytes, ready_timeout_s
        self._drivers: list[DriverProcess] = []
        self._lock = threading.Lock()
        # Drivers that die before ready (broken Java or Spark install, no memory) are replaced
        # after a growing pause, not in a tight loop.
        self._failures = 0
        self._not_before = 0.0
        self._closed = False

    def take(self, parallelism: int) -> DriverProcess | None:
        """A ready driver if there is one; else the oldest one still starting, which will be
        ready sooner than a driver started now (and two JVMs starting at once on a small
        machine only slow each other down)."""
        with self._lock:
            for d in list(self._drivers):
                if d.parallelism == parallelism and d.ready.is_set():
                    self._drivers.remove(d)
                    if self.healthy(d):
                        return d
                    log.warning("discarding unhealthy warm driver %s", d.id)
                    d.kill()
            for d in self._drivers:
                if d.parallelism == parallelism and d.alive():
                    self._drivers.remove(d)
                    return d
        return None

    def healthy(self, d: DriverProcess) -> bool:
        if not d.alive():
            return False
        if self.max_rss_bytes is None or d.pid is None:
            return True
        try:
            proc = psutil.Process(d.pid)
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
        except psutil.Error:
            return False
        return rss <= self.max_rss_bytes

    def replenish(self, free_slots: int) -> None:
        """Top the pool up to what the free slots can use; trim it if slots became scarce."""
        want = 0 if self.parallelism <= 0 else min(self.size, free_slots // self.parallelism)
        with self._lock:
            if self._closed:
                return  # shutting down: a task driver's exit must not start a new JVM
            self._drop_broken()
            surplus = len(self._drivers) - want
            for d in self._drivers[:max(0, surplus)]:
                self._drivers.remove(d)
                d.kill()
            if time.monotonic() < self._not_before:
                return
            for _ in range(want - len(self._drivers)):
                d = self.factory(self.parallelism)
                self._drivers.append(d)
                log.info("starting warm driver %s (local[%d])", d.id, self.parallelism)

    def _drop_broken(self) -> None:
        now = time.monotonic()
        for d in list(self._drivers):
            stuck = not d.ready.is_set() and now - d.started_at > self.ready_timeout_s
            if (d.ready.is_set() and not self.healthy(d)) or d.exited or stuck:
                log.warning("discarding warm driver %s (%s)", d.id, "stuck starting" if stuck else "unhealthy")
                self._drivers.remove(d)
                d.kill()

    def forget(self, d: DriverProcess) -> None:
        """A driver exited. One that never became ready counts as a start failure."""
        with self._lock:
            if d in self._drivers:
                self._drivers.remove(d)
            if d.execution_id is None and not d.ready.is_set():
                self._failures += 1
                pause = min(60.0, 2.0 ** self._failures)
                self._not_before = time.monotonic() + pause
                log.warning("warm driver %s died before it was ready (%d in a row); next try in %.0f s; "
                            "see %s", d.id, self._failures, pause, d.log_path)
            elif d.ready.is_set():
                self._failures = 0

    def status(self) -> dict:
        with self._lock:
            ready = sum(1 for d in self._drivers if d.ready.is_set())
            return {"ready": ready, "starting": len(self._drivers) - ready, "parallelism": self.parallelism}

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            for d in self._drivers:
                d.kill()
            self._drivers.clear()
