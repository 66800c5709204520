"""What a TaskManager does for a task that runs in a Spark driver process (every kind but the
no-op one, tasks/noop.py): hands the task to its driver once the driver is ready, asks it to
cancel or to take a snapshot, and turns what the driver reports, its events and its exit, into
the task's states and reports.

The hand-over happens once: when the task takes a driver that is ready, else when its driver
reports Ready; a driver not ready in time fails the task (tasks/startup.py). A cancel asks the
driver first (the query stops at a batch boundary) and kills it after `cancel_timeout_s`. A
driver that exits before its task ended fails the task with why: the reason this TaskManager
ended it for (its memory limit), else its exit code and last log lines.

The supervisor (supervisor.py) takes the slots and the driver; its lock, given here, guards every
task record.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from services.taskmanager.drivers.events import ENDINGS
from services.taskmanager.drivers.process import DriverProcess
from services.taskmanager.tasks.record import Task
from services.taskmanager.tasks.reports import TaskReports
from services.taskmanager.tasks.startup import StartupWatch, driver_start_timeout_s
from shared import task_protocol as tp
from shared.ids import ExecutionId
from shared.messages import TriggerCheckpoint
from shared.states import ExecutionState as ES

log = logging.getLogger("headrace.taskmanager")


class Finish(Protocol):
    def __call__(self, task: Task, state: ES, *, cause: str | None = None, name: str | None = None) -> None: ...


class DriverTasks:
    def __init__(
        self,
        *,
        lock: threading.RLock,
        tasks: Mapping[ExecutionId, Task],
        reports: TaskReports,
        startup: StartupWatch,
        cancel_timeout_s: float,
        finish: Finish,
        on_warm_ready: Callable[[], None],
    ) -> None:
        """`lock` and `tasks`: the supervisor's (the tasks it runs, read under its lock);
        `finish(task, state, cause=, name=)`: end the task, report it and free its slots;
        `on_warm_ready()`: a driver no task waits for started warming up or became ready."""
        self._lock, self._tasks, self.reports, self.startup = lock, tasks, reports, startup
        self.cancel_timeout_s, self._finish, self._on_warm_ready = cancel_timeout_s, finish, on_warm_ready

    def start(self, task: Task, driver: DriverProcess, kind: str) -> None:
        """`driver` (how it came: `kind`) was taken for `task`: hand the task over now if the
        driver is ready, else once it is."""
        spec = task.spec
        log.info(
            "task %s (job %s attempt %d) on %s driver %s", spec.execution_id, spec.job_id, spec.attempt, kind, driver.id
        )
        try:
            self.reports.state(spec, ES.INITIALIZING)  # taken: the deploy is acknowledged
        except Exception:  # best effort: RUNNING acknowledges it too
            log.warning("could not report task %s INITIALIZING", spec.execution_id, exc_info=True)
        if driver.ready.is_set():
            self._hand_over(task)
        else:
            # The driver gets its task when it reports ready (see on_event), unless it never
            # does; a warm driver taken while warming up skips the rest of its warm-up.
            driver.hurry()
            self.startup.arm(task, driver_start_timeout_s(task.startup_timeout_s), waiting_for_driver=True)

    def cancel(self, execution_id: ExecutionId, driver: DriverProcess) -> None:
        """Ask the task's driver to cancel it; kill the driver if it still runs after the timeout."""
        if not driver.send(tp.CancelRun()):
            driver.terminate()
        # Graceful first (the query stops at a batch boundary), forceful after the timeout.
        timer = threading.Timer(self.cancel_timeout_s, self._force_kill, args=(execution_id,))
        timer.daemon = True
        timer.start()

    def snapshot(self, task: Task, state: ES | None, cmd: TriggerCheckpoint) -> None:
        """Hand the trigger to the driver of a task in `state`, which answers with a
        snapshot_taken or snapshot_declined event; decline what cannot reach it."""
        driver = task.driver
        if state != ES.RUNNING or driver is None:
            self.reports.declined(
                cmd, f"task {cmd.execution_id} is {state.value if state else 'unknown'}, not RUNNING yet"
            )
            return
        if not driver.send(
            tp.TakeSnapshot(
                checkpoint_id=cmd.checkpoint_id,
                kind=cmd.kind,
                target=cmd.target,
                stop_after=cmd.stop_after,
                drain=cmd.drain,
            )
        ):
            self.reports.declined(cmd, "the task's Spark driver process does not accept commands (it is exiting)")

    def _force_kill(self, execution_id: ExecutionId) -> None:
        with self._lock:
            task = self._tasks.get(execution_id)
            driver = task.driver if task else None
        if driver is not None and driver.alive():
            log.warning("task %s did not stop within %.0f s; killing its driver", execution_id, self.cancel_timeout_s)
            driver.kill()

    def _hand_over(self, task: Task) -> None:
        # Called from start() and from the driver's Ready event: exactly once.
        with self._lock:
            if task.handed_over:
                return
            task.handed_over = True
            driver = task.driver
        if driver is None:
            return  # only tasks with a driver are handed over
        if task.cancel_requested:
            driver.kill()
            return
        if not driver.run_task(task.spec):
            driver.kill()  # the exit handler reports the failure
            return
        # Counted from here: the time a cold driver takes to start is not the pipeline's.
        self.startup.arm(task, task.startup_timeout_s)

    def _task_of(self, driver: DriverProcess) -> Task | None:
        return self._tasks.get(driver.execution_id) if driver.execution_id else None

    def on_event(self, driver: DriverProcess, event: Any) -> None:
        with self._lock:
            task = self._task_of(driver)
        if task is None:
            if isinstance(event, tp.Ready):
                log.info("warm driver %s ready after %.1f s", driver.id, event.startup_s)
                self._on_warm_ready()
            elif isinstance(event, tp.Warming):
                log.info("warm driver %s warming up: its session is up after %.1f s", driver.id, event.startup_s)
                self._on_warm_ready()  # placement may prefer it now (warm_pool.py, "warming")
            return
        if self.reports.forwarded(task.spec, event):
            return
        ending = ENDINGS.get(type(event))
        if ending is not None:
            state, cause, name = ending(event)
            self._finish(task, state, cause=cause, name=name)
        elif isinstance(event, tp.Ready):
            self._hand_over(task)
        elif isinstance(event, tp.Running):
            self._on_running(task)
        # Initializing: reported when this TaskManager took the task

    def _on_running(self, task: Task) -> None:
        with self._lock:
            if task.reported_terminal:
                return  # failed meanwhile (its start-up timeout): RUNNING would come too late
            if task.state != ES.CANCELING:
                task.state = ES.RUNNING
            timer = task.startup_timer
        if timer is not None:
            timer.cancel()
        self.reports.state(task.spec, ES.RUNNING)

    def on_exit(self, driver: DriverProcess, code: int) -> None:
        with self._lock:
            task = self._task_of(driver)
        if task is None:
            return
        # The attempt's live Spark checkpoint is never used again (a restart starts from a
        # copy of a completed snapshot, whose state files are hard links that survive this).
        threading.Thread(
            target=shutil.rmtree,
            args=(task.spec.checkpoint_dir,),
            kwargs={"ignore_errors": True},
            name="live-dir-cleanup",
            daemon=True,
        ).start()
        if task.reported_terminal:
            return
        if task.cancel_requested:
            self._finish(task, ES.CANCELED)
        elif driver.exit_reason is not None:  # ended by this TaskManager (its memory limit)
            self._finish(task, ES.FAILED, name=driver.exit_reason[0], cause=driver.exit_reason[1])
        else:
            self._finish(
                task,
                ES.FAILED,
                name="DriverProcessExited",
                cause=f"Spark driver process exited with code {code} before the task ended; "
                f"last lines of {driver.log_path}:\n{driver.log_tail()}",
            )
