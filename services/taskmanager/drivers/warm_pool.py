"""Warm Spark drivers for free slots.

A cold driver costs ~10 s before its first query (JVM start, SparkContext, Python workers); a
warm one has paid that already, so a submission or a failover starts in about a second. The
pool keeps up to `size` drivers of `parallelism` ready, never more than the free slots could
use, hands the oldest healthy one out, and starts a replacement in the background. A driver
that died, never became ready within `ready_timeout_s`, or grew past `max_rss_bytes` (PSS
summed, as a task's memory limit counts it) is discarded, never given a task.

Warm-ups are staggered machine-wide: a driver starts warming only with a token, and waiting
warm-ups take their turn by rank (drivers/warmup_tokens.py): a TaskManager with no driver ready or
warming and no task of its own (URGENT: the next task or failover lands there) before one that runs
the task it handed its driver to (REPLACING), before one that has a ready driver and wants another
(SPARE); `WarmPool.rank` says which this pool is. A wanted driver without a token waits, retried
every RETRY_S. A task never waits for a token: `take` hands it a ready driver, else the oldest
one already warming (it is ahead of any new JVM), else starts the task's own driver at once,
taking a free token if there is one so that no new warm-up joins its start; and while a driver
this pool handed to a task is still starting, the pool starts no warm-up of its own (a
replacement warming beside it slowed the task's start by half). Drivers in reserve warm up at the
lowest CPU priority, raised when a task takes one (drivers/process.py), so a replacement warming up
while a task runs takes only the CPU the task leaves idle (one that got none for `ready_timeout_s`
gets the normal priority, rather than being thrown away as stuck). An URGENT warm-up is the
exception: it warms up at the TaskManager's priority, because the running tasks of the machine
need it as the place to fail over to (niced, it got no CPU beside a busy task for as long as the
task ran: docs/benchmarks.md, "Failover on a just-started cluster").

Which task a driver can serve: with the local engine a warm driver runs `local[N]` and serves a
task of any parallelism p <= N (`serves_smaller`; the task still reads with p partitions, and
the TaskManager's slots share its cores as Flink's do), so warm drivers default to the
TaskManager's slot count and one of them can take any task the TaskManager can hold. A driver on
a Spark standalone cluster asks for exactly p cores when it starts, so there only p == N fits.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from services.taskmanager.drivers.process import DriverProcess
from services.taskmanager.drivers.warmup_tokens import (
    RANK_NAMES,
    REPLACING,
    SPARE,
    URGENT,
    WarmupLine,
    WarmupTokens,
    hold_until_ready,
)
from shared import backoff

log = logging.getLogger("headrace.taskmanager.warm")

RETRY_S = 0.25
BUSY_RETRY_S = 5.0  # after a warm driver could not be started at all (every drivers' user taken)


def starting_urgently(drivers) -> bool:
    """Whether one of `drivers` starts its JVM and session at the TaskManager's priority (an URGENT
    warm-up, warm_pool's rank): the next task or failover lands on its TaskManager and could not
    start before that; once the session is up a task takes the driver and cuts its warm-up short.
    The dispatcher's spare planner keeps out of its way (shared/warm_pools.py)."""
    return any(not d.ready.is_set() and not d.session_up.is_set() and not getattr(d, "niced", False) for d in drivers)


class DriverFactory(Protocol):
    """Starts a driver of `parallelism`; `for_task`: a task waits for it (no warm-up query first)."""

    def __call__(self, parallelism: int, for_task: bool = False) -> DriverProcess: ...


class WarmPool:
    def __init__(
        self,
        *,
        size: int,
        parallelism: int,
        factory: DriverFactory,
        max_rss_bytes: int | None = None,
        ready_timeout_s: float = 120.0,
        tokens: WarmupTokens | None = None,
        serves_smaller: bool = False,
    ):
        self.size, self.parallelism, self.factory = size, parallelism, factory
        self.serves_smaller = serves_smaller
        self.max_rss_bytes, self.ready_timeout_s = max_rss_bytes, ready_timeout_s
        self.tokens = tokens if tokens is not None else WarmupTokens.for_machine()
        self._drivers: list[DriverProcess] = []
        self._lock = threading.RLock()
        self._want = 0
        self._free_slots = 0  # as the last replenish saw them
        self._retrying = False
        self._task_starts: list[DriverProcess] = []  # handed to a task before they were ready
        self._handed: list[DriverProcess] = []  # handed to a task, until they exit
        self._line = WarmupLine(self.tokens)  # claimed while a wanted warm-up waits for a token
        # Drivers that die before ready (broken Java or Spark install, no memory) are replaced
        # after a growing pause, not in a tight loop.
        self._failures = 0
        self._not_before = 0.0
        # Warm-ups this pool ended itself because it wanted fewer (slots taken, shut down): their
        # exit is no start failure and earns no pause.
        self._trimmed: set[str] = set()
        self._closed = False

    def take(self, parallelism: int) -> DriverProcess | None:
        """A ready driver if there is one; else one still starting (one warming up, whose session
        is up, before one whose session is not; the oldest first), which will be ready sooner than
        a driver started now (and two JVMs starting at once on a small machine only slow each
        other down); else a driver started for the task now, without waiting for a token (None
        only once the pool is shut down)."""
        with self._lock:
            # An exact fit first, then the smallest larger one.
            fitting = sorted(
                (d for d in self._drivers if self.fits(d, parallelism)), key=lambda d: d.parallelism != parallelism
            )
            for d in [d for d in fitting if d.ready.is_set()]:
                self._drivers.remove(d)
                if self.healthy(d):
                    d.raise_priority()
                    self._handed.append(d)
                    return d
                log.warning("discarding unhealthy warm driver %s", d.id)
                d.kill()
            # Of those still starting, one whose session is up (it only has to stop its warm-up).
            for d in sorted(fitting, key=lambda d: not d.session_up.is_set()):
                if not d.ready.is_set() and d.alive():
                    self._drivers.remove(d)
                    self._task_starts.append(d)
                    self._handed.append(d)
                    d.raise_priority()
                    return d
            if self._closed:
                return None
            # For a task that waits for it: no warm-up query, the task's own first batch is one.
            d = self.factory(parallelism, for_task=True)
            self._task_starts.append(d)
            self._handed.append(d)
            token = self.tokens.try_acquire()
            if token is not None:
                hold_until_ready(self.tokens, d, token, poll_s=RETRY_S)
            log.info(
                "starting driver %s (local[%d]) for a task%s",
                d.id,
                parallelism,
                "" if token else " beside a warm-up that holds every token",
            )
            return d

    def retarget(self, parallelism: int) -> None:
        """Warm drivers of `parallelism` from now on (shared/standby_shape.py): a pool whose
        drivers serve only their own parallelism ends its idle drivers of another and warms
        one that fits instead; a pool that serves smaller tasks keeps its drivers."""
        with self._lock:
            if self.serves_smaller or parallelism == self.parallelism or parallelism < 1 or self._closed:
                return
            log.info(
                "warm drivers of parallelism %d from now on (was %d): the tasks that may fail over here run at %d",
                parallelism,
                self.parallelism,
                parallelism,
            )
            self.parallelism = parallelism
            self._want = self._wanted()
            for d in [d for d in self._drivers if d.parallelism != parallelism]:
                self._drivers.remove(d)
                self._trimmed.add(d.id)
                d.kill()
            self._top_up()

    def fits(self, d: DriverProcess, parallelism: int) -> bool:
        return d.parallelism == parallelism or (self.serves_smaller and d.parallelism > parallelism)

    def healthy(self, d: DriverProcess) -> bool:
        if not d.alive():
            return False
        if self.max_rss_bytes is None or d.pid is None:
            return True
        # The same measure as a task's memory limit (memory/limit.py): every process of the driver.
        return d.memory.within(self.max_rss_bytes)

    def replenish(self, free_slots: int) -> None:
        """Top the pool up to what the free slots can use; trim it if slots became scarce."""
        with self._lock:
            self._free_slots = free_slots
            self._want = self._wanted()
            self._top_up()

    def _wanted(self) -> int:
        # A driver that serves smaller tasks is worth keeping while any slot is free.
        per_driver = 1 if self.serves_smaller else self.parallelism
        return 0 if self.parallelism <= 0 else min(self.size, self._free_slots // per_driver)

    def rank(self) -> int:
        """This pool's place in the machine's line for warm-up tokens: URGENT while it has no
        driver ready or warming and runs no task it handed one to (the next task or failover
        lands on such a TaskManager, and would wait for a cold JVM), REPLACING while it has none
        but runs such a task, SPARE once it has one."""
        with self._lock:
            if self._drivers:
                return SPARE
            self._handed = [d for d in self._handed if not d.exited and d.alive()]
            return REPLACING if self._handed else URGENT

    def _top_up(self) -> None:
        with self._lock:
            if self._closed:
                self._line.leave()
                return  # shutting down: a task driver's exit must not start a new JVM
            self._drop_broken()
            surplus = len(self._drivers) - self._want
            for d in self._drivers[: max(0, surplus)]:
                self._drivers.remove(d)
                self._trimmed.add(d.id)
                d.kill()
            self._task_starts = [d for d in self._task_starts if not d.ready.is_set() and not d.exited and d.alive()]
            if time.monotonic() < self._not_before or (self._task_starts and len(self._drivers) < self._want):
                self._line.leave()  # not asking for a token now: no warm-up should wait for this one
                if self._task_starts:
                    self._retry_later()
                return
            self._promote_if_urgent()
            while len(self._drivers) < self._want:
                rank = self.rank()
                token = self.tokens.try_acquire(rank)
                if token is None:
                    self._line.wait(rank)
                    self._retry_later()
                    return
                try:
                    d = self.factory(self.parallelism)
                except OSError as exc:  # no user free for it (shared/sandbox_users.py), no directory
                    token.release()
                    log.warning("cannot start a warm driver now (%s); trying again in %.0f s", exc, BUSY_RETRY_S)
                    self._not_before = time.monotonic() + BUSY_RETRY_S
                    self._line.leave()
                    self._retry_later()
                    return
                except BaseException:
                    token.release()
                    raise
                if rank == URGENT:
                    # Every running task of the machine may fail over here: this warm-up is theirs.
                    d.raise_priority()
                self._drivers.append(d)
                hold_until_ready(self.tokens, d, token, rank, poll_s=RETRY_S)
                log.info("starting warm driver %s (local[%d], %s)", d.id, self.parallelism, RANK_NAMES[rank])
            self._line.leave()

    def _promote_if_urgent(self) -> None:
        """A warm-up started at the lowest priority beside this pool's task, whose task has
        ended since: with no ready driver here, it is the one a failover would wait for."""
        self._handed = [d for d in self._handed if not d.exited and d.alive()]
        if self._handed or any(d.ready.is_set() for d in self._drivers):
            return
        for d in self._drivers:
            if getattr(d, "niced", False):
                log.info("warm driver %s is now this TaskManager's only prospect; warming it at full priority", d.id)
                d.raise_priority()
                return

    def _retry_later(self) -> None:
        if self._retrying:
            return
        self._retrying = True

        def retry() -> None:
            while True:
                time.sleep(RETRY_S)
                with self._lock:
                    self._top_up()
                    if self._closed or len(self._drivers) >= self._want:
                        self._retrying = False
                        return

        threading.Thread(target=retry, name="warm-retry", daemon=True).start()

    def _drop_broken(self) -> None:
        now = time.monotonic()
        for d in list(self._drivers):
            if not d.ready.is_set() and getattr(d, "niced", False) and now - d.started_at > self.ready_timeout_s:
                # Not stuck, starved: busy tasks left it no CPU at nice 19. From now on it competes
                # at full priority and is judged stuck only after another ready_timeout_s.
                log.info(
                    "warm driver %s got no CPU to warm up in %.0f s; raising its priority", d.id, now - d.started_at
                )
                d.raise_priority()
                d.started_at = now
                continue
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
            if d.id in self._trimmed:
                self._trimmed.discard(d.id)
            elif d.execution_id is None and not d.ready.is_set():
                self._failures += 1
                pause = backoff.exponential(self._failures + 1, first_s=1.0, max_s=60.0)
                self._not_before = time.monotonic() + pause
                log.warning(
                    "warm driver %s died before it was ready (%d in a row); next try in %.0f s; see %s",
                    d.id,
                    self._failures,
                    pause,
                    d.log_path,
                )
            elif d.ready.is_set():
                self._failures = 0

    def status(self) -> dict:
        with self._lock:
            ready = sum(1 for d in self._drivers if d.ready.is_set())
            warming = sum(1 for d in self._drivers if not d.ready.is_set() and d.session_up.is_set())
            waiting = max(0, self._want - len(self._drivers))
            return {
                "ready": ready,
                "starting": len(self._drivers) - ready,
                "warming": warming,  # of those starting: their session is up, the warm-up runs
                "waiting": waiting,
                "parallelism": self.parallelism,
                "rank": RANK_NAMES[self.rank()] if waiting else None,
                "urgent": starting_urgently(self._drivers) or bool(waiting and self.rank() == URGENT),
            }

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._line.leave()
            for d in self._drivers:
                self._trimmed.add(d.id)
                d.kill()
            self._drivers.clear()
