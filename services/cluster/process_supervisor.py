"""Restarts the children of `headrace up` that exit while the cluster is meant to run.

Policy (`RestartPolicy`, a pure function of the exit history): the first restart after a child
ran well waits `initial_s` (1 s); each further exit within `reset_after_s` (60 s) of its last
start doubles the wait, up to `max_s` (30 s). A child that ran for a minute counts as healthy
again. Every exit is reported (printed by `headrace up`, else logged) with its code, the restart
number and the log file to read; from the third quick exit on the child is called a crash loop,
so a child that can never start is visible (`restarts`, `last_exit` in cluster.json) rather
than silently respawned.

The supervisor only watches and restarts; the cluster owns the processes (`restart(name)`
starts a new one with the child's command and environment). `stop()` ends supervision before
the cluster stops its children, so no child is restarted while the cluster shuts down.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from shared import backoff

log = logging.getLogger("headrace.up")

CRASH_LOOP_AFTER = 3  # quick exits in a row


@dataclass(frozen=True)
class RestartPolicy:
    initial_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"restart backoff must satisfy 0 < initial ({self.initial_s}) <= max ({self.max_s})")

    def quick_exits(self, previous: int, ran_s: float) -> int:
        """How many quick exits in a row, counting this one."""
        return 1 if ran_s >= self.reset_after_s else previous + 1

    def delay(self, quick_exits: int) -> float:
        return backoff.exponential(quick_exits, first_s=self.initial_s, max_s=self.max_s)


@dataclass
class ChildRecord:
    """What an operator needs to see about one child's restarts."""

    restarts: int = 0
    quick_exits: int = 0
    last_exit: int | None = None
    last_exit_at: float | None = None  # wall clock, for cluster.json
    started_at: float = field(default_factory=time.monotonic)
    restart_at: float | None = None  # monotonic; set while a restart waits out its backoff

    def view(self) -> dict:
        return {
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "last_exit_at": (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.last_exit_at)) if self.last_exit_at else None
            ),
            "crash_loop": self.quick_exits >= CRASH_LOOP_AFTER,
        }


class Supervised(Protocol):
    """The cluster as the supervisor sees it."""

    def live_children(self) -> dict[str, tuple[int, int | None, Path]]:
        """name -> (pid, exit code or None while it runs, log file)."""

    def restart(self, name: str) -> None:
        """Start the exited child `name` again (same command, same environment)."""

    def supervision_changed(self) -> None:
        """Called after every restart, e.g. to rewrite cluster.json."""


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(
        self,
        cluster: Supervised,
        *,
        policy: RestartPolicy | None = None,
        poll_s: float = 0.2,
        notify: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cluster = cluster
        self.policy = policy or RestartPolicy()
        self.poll_s = poll_s
        self.notify = notify
        self.clock = clock
        self.records: dict[str, ChildRecord] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards records
        self._restarting = threading.Lock()  # held while a restart is under way; stop() waits for it

    def start(self) -> "Supervisor":
        now = self.clock()
        for name in self.cluster.live_children():
            self.records.setdefault(name, ChildRecord(started_at=now))
        self._thread = threading.Thread(target=self._run, name="headrace-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        # A restart may be half done when stop() is called: wait for it, so the cluster stops
        # the process it started rather than miss it.
        with self._restarting:
            pass

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def view(self) -> dict[str, dict]:
        with self._lock:
            return {name: rec.view() for name, rec in self.records.items()}

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # the supervisor must outlive any one bad restart
                log.exception("supervisor: checking the children failed; trying again")

    def check(self) -> None:
        """One pass: note new exits, restart children whose backoff has passed. The cluster is
        called without holding our lock: it calls back into view() from other threads."""
        now = self.clock()
        for name, (pid, code, log_path) in self.cluster.live_children().items():
            if self._stop.is_set():
                return
            exited = None
            with self._lock:
                rec = self.records.setdefault(name, ChildRecord(started_at=now))
                if code is None:
                    if rec.restart_at is not None:  # someone restarted it by hand meanwhile
                        rec.restart_at, rec.started_at = None, now
                    continue
                if rec.restart_at is None:
                    exited = self._note_exit(rec, code, now)
                due = rec.restart_at is not None and now >= rec.restart_at  # _note_exit has set it
            if exited is not None:
                self._say(f"{name} (pid {pid}) {exited}; see {log_path}", warning=True)
                self.cluster.supervision_changed()
            if not due:
                continue
            with self._restarting:
                if self._stop.is_set():
                    return
                self.cluster.restart(name)
            with self._lock:
                rec.restarts += 1
                rec.started_at = self.clock()
                rec.restart_at = None
            self._say(f"{name} restarted (restart {rec.restarts})")
            self.cluster.supervision_changed()

    def _note_exit(self, rec: ChildRecord, code: int, now: float) -> str:
        rec.quick_exits = self.policy.quick_exits(rec.quick_exits, now - rec.started_at)
        rec.last_exit, rec.last_exit_at = code, time.time()
        delay = self.policy.delay(rec.quick_exits)
        rec.restart_at = now + delay
        loop = (
            f"; crash loop: {rec.quick_exits} exits within {self.policy.reset_after_s:.0f} s of a start"
            if rec.quick_exits >= CRASH_LOOP_AFTER
            else ""
        )
        return f"{describe_exit(code)}; restarting in {delay:.0f} s (restart {rec.restarts + 1}{loop})"

    def _say(self, message: str, *, warning: bool = False) -> None:
        if self.notify is not None:  # `headrace up` prints to its terminal instead of logging
            self.notify(f"supervisor: {message}")
        else:
            (log.warning if warning else log.info)("supervisor: %s", message)
