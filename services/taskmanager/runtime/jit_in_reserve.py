"""While a driver waits in reserve, its JVM's optimizing compiler (C2) only uses idle CPU.

A Spark driver's JVM spends about half of its start-up CPU in HotSpot's C2 compiler thread
(~10 of ~20 CPU-s on 2 cores, docs/benchmarks.md "Cluster start"), compiling the code that
SparkContext creation, Catalyst and Janino ran hot. A driver warming up in reserve needs none of
that to be ready: the interpreter and the quick C1 compiler carry the warm-up, and C2's queue is
compiled later, when a core is idle, or once a task takes the driver. When two drivers warm up
at once on two cores (`headrace up`), each one's C2 otherwise takes CPU the other needs.

So, while in reserve, every C2 compiler thread of the driver's JVM runs under SCHED_IDLE (the
kernel gives it a core only when nothing else wants one); `release` puts them back under
SCHED_OTHER, at the nice value the thread has then (the TaskManager raises a taken driver's
priority, drivers/process.py). HotSpot itself drops queued compilations of methods that went cold
meanwhile, so starved work is partly never done at all. C2 threads are found by name
("C2 CompilerThre", as Linux truncates it) among the threads of every `java` process under this
one (or the given one), polled until released: the JVM starts after this does, and HotSpot may add C2 threads as
its queue grows (UseDynamicNumberOfCompilerThreads). Linux only; elsewhere it does nothing.

Leaving SCHED_IDLE is a raise of priority, which the kernel refuses an unprivileged process
(RLIMIT_NICE 0, the default; a container's root cannot raise that limit without
CAP_SYS_RESOURCE). A driver running as a drivers' user therefore cannot give its own C2 back: its
TaskManager (root) does, `give_back`, at the task's first batch or TASK_GRACE_S after handing it
over (drivers/process.py), and says so with --c2-given-back-by-taskmanager. Where neither may,
C2 is never idled: a C2 kept idle under a running task leaves the task's hot code to C1, and
the task pays (docs/benchmarks.md, "Kafka -> PostgreSQL").
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from shared import cpu_priority

log = logging.getLogger("headrace.taskmanager.jit")

C2_THREAD_NAME = "C2 CompilerThre"
FIRST_POLL_S = 0.05  # until the JVM's C2 thread is found: it compiles from the JVM's first second
# Then rarely: a poll reads every thread's name (~2-3 ms of CPU), for as long as the driver waits.
POLL_S = 5.0
# A task that took the driver gets C2 back at its first committed batch, or this long after it arrived.
TASK_GRACE_S = 5.0


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except (OSError, ValueError):
        return []


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _comm(path: Path) -> str:
    try:
        return (path / "comm").read_text().rstrip("\n")
    except OSError:
        return ""


def c2_threads(root_pid: int) -> list[int]:
    """Thread ids of every C2 compiler thread of the JVMs at or below `root_pid`."""
    tids = []
    for pid in [root_pid, *_descendants(root_pid)]:
        proc = Path(f"/proc/{pid}")
        if _comm(proc) != "java":
            continue
        try:
            threads = list((proc / "task").iterdir())
        except OSError:
            continue
        tids += [int(t.name) for t in threads if _comm(t) == C2_THREAD_NAME]
    return tids


def _set_policy(tid: int, policy: int) -> bool:
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
        return True
    except ProcessLookupError:
        return False  # the thread (or its JVM) has ended
    except OSError:
        log.warning("could not change the scheduling policy of C2 thread %d", tid, exc_info=True)
        return False


class OptimizerInReserve:
    """`start()` before the JVM starts; `release()` when a task takes the driver (idempotent)."""

    def __init__(self, root_pid: int | None = None, *, given_back_by_parent: bool = False):
        self.root_pid = root_pid if root_pid is not None else os.getpid()
        self.idled: set[int] = set()
        self._released = threading.Event()
        self._lock = threading.Lock()
        # Whether this process may give C2 back itself; else the parent must have said it will.
        self.may_release = cpu_priority.may_return_to_normal_priority()
        self.supported = (
            hasattr(os, "SCHED_IDLE")
            and Path("/proc/self/task").is_dir()
            and (self.may_release or given_back_by_parent)
        )

    def start(self) -> "OptimizerInReserve":
        if self.supported:
            threading.Thread(target=self._watch, name="c2-in-reserve", daemon=True).start()
        return self

    def _watch(self) -> None:
        while not self._released.wait(POLL_S if self.idled else FIRST_POLL_S):
            self.idle_new_threads()

    def idle_new_threads(self) -> None:
        with self._lock:
            if self._released.is_set():
                return
            for tid in c2_threads(self.root_pid):
                if tid not in self.idled and _set_policy(tid, os.SCHED_IDLE):
                    self.idled.add(tid)

    def release_after(self, seconds: float) -> None:
        """Release at the latest `seconds` from now (`release` may come sooner)."""
        timer = threading.Timer(seconds, self.release)
        timer.daemon = True
        timer.start()

    def release(self) -> None:
        with self._lock:
            if self._released.is_set():
                return
            self._released.set()
            if not self.may_release:
                return  # the TaskManager gives it back (give_back)
            for tid in sorted(self.idled):
                _set_policy(tid, os.SCHED_OTHER)


def give_back(root_pid: int) -> int:
    """Every idle C2 thread of the JVMs at or below `root_pid` back under SCHED_OTHER, done by a
    process that may (the TaskManager, for its drivers); how many it moved."""
    moved = 0
    for tid in c2_threads(root_pid):
        try:
            idle = os.sched_getscheduler(tid) == os.SCHED_IDLE
        except OSError:
            continue  # the thread ended
        if idle and _set_policy(tid, os.SCHED_OTHER):
            moved += 1
    return moved
