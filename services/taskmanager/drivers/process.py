"""One supervised Spark driver process (see shared.task_protocol for the protocol).

The driver runs in its own session (process group), so killing the group takes its JVM and
Python workers with it, and as a user of its own (drivers/home.py, shared/sandbox_users.py). Its
Spark local and temporary directories live under a directory the TaskManager makes and deletes
when the process ends (a kill -9 leaves spark-*, blockmgr-* and RocksDB copies behind otherwise).

A driver started in reserve (a warm driver) warms up at the lowest CPU priority: a JVM warming
up takes a whole core for 10-15 s, and on a small machine the running tasks' drivers must not
lose that core to a driver nobody asked for yet. The task that takes it raises it back to the
TaskManager's own priority (`raise_priority`; every thread of its session: Spark's Python
daemons leave the driver's process group, and the task's Python workers fork from them). The
session's autogroup gets the same nice value: with autogroup scheduling, sessions share the CPU
as equals whatever their processes' nice values (shared/cpu_priority.py). Where the
TaskManager could not raise it back (not root and RLIMIT_NICE too low), warm drivers keep the
normal priority instead.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from services.taskmanager.drivers.driver_memory import DriverMemory
from services.taskmanager.drivers.env import driver_environment
from services.taskmanager.drivers.events import decoded_events
from services.taskmanager.drivers.home import DriverHome
from services.taskmanager.drivers.rotating_log import RotatingLog
from services.taskmanager.drivers.sandbox import DriverSandbox
from services.taskmanager.drivers.task_processes import TaskProcesses
from services.taskmanager.memory import limit as memory_limit
from shared import backoff, cpu_priority
from shared import task_protocol as tp
from shared.driver_contract import STACK_DUMP_SIGNAL, WARM_UP_BATCHES, kill_session, remove_python_socket_dirs
from shared.ids import ExecutionId

log = logging.getLogger("headrace.taskmanager.driver")


def remove_driver_dirs(drivers: Path) -> None:
    """Remove the drivers' work directories under `drivers` and their Python socket directories
    in /tmp (driver_contract.python_socket_dir): what drivers killed with their TaskManager left."""
    if drivers.is_dir():
        for home in drivers.iterdir():
            remove_python_socket_dirs(home / "work")
    shutil.rmtree(drivers, ignore_errors=True)


_ids = itertools.count(1)

# A driver in reserve warms up at the lowest priority, its session's autogroup too: with autogroup
# scheduling a process's own nice weighs only against its session's processes, and a warm-up at
# nice 19 took as much CPU as the running task beside it (docs/benchmarks.md, "Throughput").
WARMUP_NICE = cpu_priority.RESERVE_NICE
may_raise_priority = cpu_priority.may_raise_priority


def warm_up_args(in_reserve: bool, query: bool, batches: int = WARM_UP_BATCHES) -> tuple[str, ...]:
    """The runner's warm-up flags. A driver a task waits for skips the warm-up and keeps its JIT's
    optimizer; one in reserve defers C2 and runs the warm-up query for `batches` micro-batches
    (Settings.warm_up_batches) unless Settings.warm_up_query is off."""
    if not in_reserve:
        return ("--no-warmup",)
    return ("--warm-up-batches", str(batches)) if query else ("--no-warmup-query",)


class DriverProcess:
    def __init__(
        self,
        *,
        parallelism: int,
        workdir: Path,
        driver_memory: str,
        shuffle_partitions: int,
        on_event: Callable[["DriverProcess", object], None],
        on_exit: Callable[["DriverProcess", int], None],
        engine_args: Sequence[str] = (),
        warm_up: bool = True,
        warm_up_query: bool = True,
        warm_up_batches: int = WARM_UP_BATCHES,
        sandbox: DriverSandbox | None = None,
    ):
        self.id = f"d{os.getpid()}-{next(_ids)}"
        self.parallelism = parallelism
        self.drivers = workdir
        self.workdir = workdir / self.id / "work"
        self.log_path = workdir.parent / "logs" / f"driver-{self.id}.log"
        self.driver_memory, self.shuffle_partitions = driver_memory, shuffle_partitions
        self.engine_args = list(engine_args)  # where its work runs (runner.py --master ...)
        self.warm_up = warm_up  # False: a task waits for this driver, it runs no warm-up query first
        self.warm_up_query = warm_up_query  # Settings.warm_up_query, for a driver in reserve
        self.warm_up_batches = warm_up_batches  # Settings.warm_up_batches
        self.niced = False  # warming up in reserve at WARMUP_NICE (see the module docstring)
        self.on_event, self.on_exit = on_event, on_exit
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        self.session_up = threading.Event()  # its SparkSession is built: warming up, or ready
        self.started_at = time.monotonic()
        self.execution_id: ExecutionId | None = None
        self.exited = False
        self._lock = threading.Lock()
        # Its user, cgroup, memory limit and log cap (drivers/sandbox.py); none of them by default.
        self.sandbox = sandbox or DriverSandbox()
        self.home: DriverHome | None = None  # its user and directories, once started
        self.processes = TaskProcesses(str(self.workdir), uid=None)
        self.log = RotatingLog(self.log_path, max_bytes=self.sandbox.log_max_bytes, backups=self.sandbox.log_backups)
        # (failure name, cause) when this TaskManager ended the driver for its task's sake (memory):
        # the task fails with it, whatever the driver reports while it dies.
        self.exit_reason: tuple[str, str] | None = None
        # Its task's memory: limit, watch and latest figure (drivers/driver_memory.py).
        self.memory = DriverMemory(self.processes, self.sandbox, name=self.id, on_exceeded=self._memory_exceeded)

    def start(self) -> "DriverProcess":
        lease = self.sandbox.users.acquire(f"driver {self.id}")
        user = lease.user if lease is not None else self.sandbox.users.sample
        self.home = home = DriverHome(self.drivers, self.id, user, lease)
        self.processes.uid = user.uid if user.isolated else os.geteuid()
        try:
            home.make()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            if self.sandbox.cgroups is not None:
                self.processes.cgroup = self.sandbox.cgroups.for_driver(self.id)
            self._spawn(user)
        except BaseException:
            self.processes.release()
            home.remove()
            raise
        assert self.proc is not None
        self.processes.attach(self.proc.pid)
        self.log.start(self._log_read, self.id)
        threading.Thread(target=self._reap, name=f"reap-{self.id}", daemon=True).start()
        if self.warm_up and may_raise_priority():
            # Before the runner starts its JVM (importing PySpark alone takes a second): every
            # later thread and child inherits the priority.
            self.lower_priority()
        threading.Thread(
            target=self._read_events, args=(self._events_read,), name=f"events-{self.id}", daemon=True
        ).start()
        return self

    def _spawn(self, user) -> None:
        assert self.home is not None
        read_fd, write_fd = os.pipe()
        log_read, log_write = os.pipe()
        # An allow-list, not this process's environment (drivers/env.py); SPARK_LOCAL_IP: the
        # runner sets it from its --host.
        env = driver_environment(os.environ, workdir=self.workdir, user=user.name)
        cmd = [
            sys.executable,
            "-m",
            "services.taskmanager.runtime.runner",
            "--parallelism",
            str(self.parallelism),
            "--workdir",
            str(self.workdir),
            "--events-fd",
            str(write_fd),
            "--driver-memory",
            self.driver_memory,
            "--shuffle-partitions",
            str(self.shuffle_partitions),
            "--parent-pid",
            str(os.getpid()),
            "--waiting-marker",
            str(self.home.waiting_marker()),
            *self.engine_args,
            *warm_up_args(self.warm_up, self.warm_up_query, self.warm_up_batches),
            *(("--spark-ui",) if self.sandbox.spark_ui else ()),
        ]
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=log_write,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,
                env=env,
                cwd=self.workdir,
                **user.popen_kwargs(),
            )
        except BaseException:
            os.close(read_fd)
            os.close(log_read)
            raise
        finally:
            os.close(write_fd)
            os.close(log_write)
        self._events_read, self._log_read = read_fd, log_read

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def lower_priority(self) -> None:
        """Warm up at WARMUP_NICE: the driver's process group and its session's autogroup."""
        if self.proc is not None:
            self.niced = cpu_priority.lower(self.proc.pid)

    def raise_priority(self) -> None:
        """A task took this driver: every process group of its session back to the TaskManager's
        priority, and the session's autogroup. The session, not only the group: Spark's Python
        worker daemons (started during the warm-up, so niced too) move to process groups of their
        own, and the task's Python workers are forked from them."""
        if self.niced and self.proc is not None:
            cpu_priority.restore(self.proc.pid)
            self.niced = False

    def hurry(self) -> None:
        """A task waits for this driver: it skips what is left of its warm-up (task_protocol)."""
        try:
            if self.home is not None:
                self.home.mark_waiting()
        except OSError:  # the driver is gone or its directory with it: its exit is reported anyway
            log.warning("could not tell driver %s that a task waits for it", self.id, exc_info=True)

    def run_task(self, spec: tp.TaskSpec) -> bool:
        """Hand the task to the driver as the sandbox shapes it, and watch its memory from now on.
        False if the driver cannot take it (exit_reason says why when it was the hand-over)."""
        try:
            limit = self.memory.task_limit(spec)
        except memory_limit.MemoryLimitRefused as exc:
            log.warning("task %s refused: %s", spec.execution_id, exc)
            self.exit_reason = (type(exc).__name__, str(exc))
            return False
        try:
            assert self.home is not None, "a driver is handed a task once started"
            spec = self.sandbox.task_spec(spec, self.home)
        except Exception as exc:  # whatever broke, the task fails with it
            log.warning("task %s could not be handed to driver %s", spec.execution_id, self.id, exc_info=True)
            self.exit_reason = (
                "TaskHandOverFailed",
                f"the task could not be handed to its Spark driver: {type(exc).__name__}: {exc}",
            )
            return False
        if not self.send(tp.RunTask(spec=spec)):
            return False
        self.memory.watch(limit)
        return True

    def _memory_exceeded(self, cause: str) -> None:
        log.warning("driver %s (task %s): %s", self.id, self.execution_id, cause)
        self.exit_reason = (memory_limit.NAME, cause)
        self.kill()

    def send(self, command) -> bool:
        storage = self.home.storage if self.home is not None else None
        if isinstance(command, tp.TakeSnapshot) and storage is not None:
            try:
                storage.snapshot_target(Path(command.target))
            except OSError:
                log.warning(
                    "could not prepare the snapshot target %s for driver %s", command.target, self.id, exc_info=True
                )  # the driver's decline says what failed
        try:
            assert self.proc and self.proc.stdin
            self.proc.stdin.write(tp.encode_line(command))
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError, AssertionError):
            return False

    def kill(self) -> None:
        """SIGKILL every process of the driver: its session's groups (driver, JVM, and Spark's
        Python daemons and workers, which left the driver's group, see raise_priority: a worker
        stuck in a pipeline's loop would outlive its driver, never noticing the JVM gone), and
        whatever left the session (its cgroup, else descendants and its mark: drivers/task_processes.py)."""
        if self.proc is None:
            return
        kill_session(self.proc.pid)
        self.processes.kill()

    def terminate(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def dump_stacks(self) -> None:
        """Ask the driver (its Python process only, not the JVM) to write its threads' stacks to
        its log: where a stuck pipeline is stuck (drivers/startup_report.py reads them)."""
        if self.proc is None:
            return
        try:
            os.kill(self.proc.pid, STACK_DUMP_SIGNAL)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        data = self.log.tail(max(16384, lines * 300))
        return b"\n".join(data.splitlines()[-lines:]).decode(errors="replace")

    def _reap(self) -> None:
        """When the driver exits, so does everything it started: a process it forked holds its
        events pipe, which would otherwise never reach EOF (and its exit never be handled)."""
        if self.proc is not None:
            self.proc.wait()
        self.kill()

    def _read_events(self, fd: int) -> None:
        try:
            for event in decoded_events(fd, self.id):
                if isinstance(event, tp.Warming):
                    self.session_up.set()
                if isinstance(event, tp.Ready):
                    self.session_up.set()
                    self.ready.set()
                if self.exit_reason is not None:
                    continue  # being killed for its task's sake: that is the task's end
                if self.home is not None:
                    event = self.home.checked(event, self.send)
                if event is not None:
                    self._deliver(functools.partial(self.on_event, self, event))
        finally:
            os.close(fd)
        code = self.proc.wait() if self.proc else -1
        self.memory.stop()
        # The group may still hold a JVM whose parent just died; make sure nothing survives.
        self.kill()
        self.processes.release()
        self.exited = True
        remove_python_socket_dirs(self.workdir)
        if self.home is not None:
            self.home.remove()
        self._deliver(lambda: self.on_exit(self, code))

    def _deliver(self, call, attempts: int = 30) -> None:
        """Reports go to Redis; during an outage keep retrying rather than losing the reader
        thread (and with it all supervision of the task)."""
        for i in range(attempts):
            try:
                call()
                return
            except Exception:
                log.exception("driver %s: handling an event failed (try %d); retrying", self.id, i + 1)
                time.sleep(backoff.exponential(i + 1, first_s=0.2, max_s=5.0))
