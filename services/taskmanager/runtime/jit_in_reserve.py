"""A warm driver's JVM compiles with its optimizing compiler (C2) on idle CPU only, for its whole life.

A Spark driver's JVM spends about half of its start-up CPU in HotSpot's C2 compiler thread
(~10 of ~20 CPU-s on 2 cores, docs/benchmarks.md "Cluster start"), compiling the code that
SparkContext creation, Catalyst and Janino ran hot. A driver warming up in reserve needs none of
that to be ready: the interpreter and the quick C1 compiler carry the warm-up, and C2's queue is
compiled when a core is idle. When two drivers warm up at once on two cores (`headrace up`), each
one's C2 otherwise takes CPU the other needs.

So every C2 compiler thread of the driver's JVM runs under SCHED_IDLE (the kernel gives it a
core only when nothing else wants one), and stays there when a task takes the driver: given back
at the task's first batch, C2's catching up took the CPU the task's micro-batches needed, and a
small stateful job's p99 latency in its first minute was 0.91 s against 0.76-0.80 s with C2 left
idle, the same (0.38-0.40 s) after its third minute (docs/benchmarks.md, "Kafka -> PostgreSQL").
A driver started for a waiting task (no warm-up) keeps C2 as the JVM has it. HotSpot itself
drops queued compilations of methods that went cold meanwhile, so starved work is partly never
done at all. C2 threads are found by name ("C2 CompilerThre", as Linux truncates it) among the
threads of every `java` process under this one (or the given one), polled every POLL_S: the JVM
starts after this does, and HotSpot may add C2 threads as its queue grows
(UseDynamicNumberOfCompilerThreads). `release` ends that (tests; a process that may leave
SCHED_IDLE gets C2 back: an unprivileged driver may not, RLIMIT_NICE). Linux only; elsewhere it
does nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("headrace.taskmanager.jit")

C2_THREAD_NAME = "C2 CompilerThre"
FIRST_POLL_S = 0.05  # until the JVM's C2 thread is found: it compiles from the JVM's first second
# Then rarely: a poll reads every thread's name (~2-3 ms of CPU), for as long as the driver waits.
POLL_S = 5.0


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

    def __init__(self, root_pid: int | None = None):
        self.root_pid = root_pid if root_pid is not None else os.getpid()
        self.idled: set[int] = set()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.supported = hasattr(os, "SCHED_IDLE") and Path("/proc/self/task").is_dir()

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

    def release(self) -> None:
        with self._lock:
            if self._released.is_set():
                return
            self._released.set()
            for tid in sorted(self.idled):
                _set_policy(tid, os.SCHED_OTHER)
