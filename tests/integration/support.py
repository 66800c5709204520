"""Support shared by the integration modules that has no topic module of its own (those are
bus_reading.py, dispatcher_support.py, planner_support.py and bench_runs.py beside this one)."""

from __future__ import annotations

import psutil

from tests.waiting import wait_for


def alive(pid: int) -> bool:
    """A process that exists and is no zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(what: str, pids, timeout_s: float, poll_s: float) -> None:
    """Wait until none of `pids` is alive; WaitTimeout (with the survivors) saying `what` otherwise."""
    wait_for(what, lambda: [p for p in pids if alive(p)], timeout_s, poll_s=poll_s, until=lambda left: left == [])
