"""The driver's lines to the TaskManager: protocol events on a private fd (EventWriter), the
phases of a starting task in the log (PhaseLog), the watchdog that ends a driver whose
TaskManager died, and the exit paths that leave no process or hung Spark behind."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from shared.driver_contract import PHASE_MARKER
from shared.task_protocol import encode_line


class PhaseLog:
    """Tells the log (and through it the TaskManager) what the starting task is doing, and when
    (seconds since the task arrived): where a slow start spends its time."""

    def __init__(self) -> None:
        self._t0: float | None = None

    def task_arrived(self) -> None:
        self._t0 = time.monotonic()

    def announce(self, phase: str) -> None:
        at = f" (+{time.monotonic() - self._t0:.3f} s)" if self._t0 is not None else ""
        print(f"{PHASE_MARKER}{phase}{at}", flush=True)


class EventWriter:
    """Protocol events on a private dup of the events fd.

    The dup is not inheritable and the original is closed, so the JVM and Python workers never
    hold the pipe: the TaskManager sees EOF exactly when this process dies.
    """

    def __init__(self, fd: int) -> None:
        new_fd = os.dup(fd)
        if fd == 1:
            os.dup2(2, 1)  # stdout must not mix with protocol lines: send it to the log
        elif fd > 2:
            os.close(fd)
        self._out: IO[bytes] = os.fdopen(new_fd, "wb", buffering=0)
        self._lock = threading.Lock()

    def emit(self, event: Any) -> None:
        with self._lock:
            try:
                self._out.write(encode_line(event))
            except OSError:
                pass  # reader gone: the parent is dying and the watchdog will end us


def start_watchdog(
    on_orphaned: Callable[[], None], interval: float = 0.5, parent: int | None = None
) -> threading.Thread:
    """Call `on_orphaned` once this process's parent is no longer `parent` (default: the parent
    it has now). The TaskManager passes its pid: a TaskManager killed before this runs would
    otherwise leave init as the parent to watch, and the driver would never notice."""
    parent = parent or os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                on_orphaned()
                return

    t = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    t.start()
    return t


def end_own_session() -> None:
    """SIGKILL every process of this driver's session, this one last; only when this process
    leads its session, as a TaskManager starts it (a runner started by hand shares its caller's).
    A JVM that has not yet reached its read of stdin (it does so after writing its connection
    file, which fails when a restarted TaskManager has removed the old work dir) never sees this
    process die and waits for Py4J connections forever; Spark's Python daemons are in groups of
    their own."""
    from shared.driver_contract import kill_session

    me = os.getpid()
    if os.getsid(0) == me and os.getpgrp() == me:
        kill_session(me, leader_last=True)


def stop_spark_quietly(spark: Any, timeout: float) -> None:
    """spark.stop() that cannot hang the exit path."""
    if spark is None:
        return
    t = threading.Thread(target=spark.stop, daemon=True)
    t.start()
    t.join(timeout)
