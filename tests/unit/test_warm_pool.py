"""Warm pool sizing and shutdown, with stand-in drivers (no JVM)."""

from __future__ import annotations

import threading
import time

from services.taskmanager.warm_pool import WarmPool


class _Driver:
    def __init__(self, parallelism):
        self.parallelism, self.id, self.pid = parallelism, f"d{id(self)}", None
        self.ready, self.execution_id, self.exited = threading.Event(), None, False
        self.started_at, self.killed = time.monotonic(), False

    def alive(self):
        return not self.killed

    def kill(self):
        self.killed = True


def _pool(started):
    def factory(p):
        d = _Driver(p)
        started.append(d)
        return d
    return WarmPool(size=2, parallelism=1, factory=factory)


def test_keeps_no_more_drivers_than_free_slots_can_use():
    started = []
    pool = _pool(started)
    pool.replenish(free_slots=4)
    assert len(started) == 2
    pool.replenish(free_slots=1)
    assert [d.killed for d in started].count(True) == 1


def test_a_pool_that_shut_down_starts_nothing():
    # Regression: killing a task driver at shutdown reported a free slot, and the pool started
    # a fresh JVM that outlived the TaskManager by seconds.
    started = []
    pool = _pool(started)
    pool.replenish(free_slots=2)
    pool.shutdown()
    assert all(d.killed for d in started)
    pool.replenish(free_slots=2)
    assert len(started) == 2
