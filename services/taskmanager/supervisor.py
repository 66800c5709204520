"""The TaskManager's task supervisor: slots, running tasks, their driver processes, reports.

It owns the slot table of one TaskManager, turns DeployTask/CancelTask/TriggerCheckpoint commands
into driver process actions, maps driver events to ExecutionState reports and checkpoint
acknowledgements for the JobManager, and frees slots when an attempt ends. Celery command handlers
call `deploy`/`cancel` and return at once; everything long-running happens in driver processes and
their reader threads.

A task is reported INITIALIZING as soon as this TaskManager has taken it: that is the JobManager's
acknowledgement of the deploy, which must not wait for a cold Spark driver (~10-30 s) to start.

Start-up timeout: a task that is not RUNNING `headrace.task.startup-timeout` after its driver got
it (the pipeline hangs at import, in build(), or while its query starts) fails with
`PipelineStartupTimeout`: the driver dumps its threads' stacks into its log, the failure cause
says which phase it was in and where, and the driver is killed. The JobManager then treats it
like any other failure (restart strategy). A driver that is not ready within that timeout (at least 2 min) after
it was handed a task fails it the same way. A deploy that breaks before its task starts (an
option the task cannot read, a driver that cannot be started) fails the attempt and frees its
slots, rather than leaving it DEPLOYING.

Its rooms: tasks/record.py (what is kept of a task), tasks/slot_table.py (which allocation holds each
slot), drivers/supply.py (warm or cold drivers, the warm pool's upkeep), tasks/startup.py (the
start-up timers), tasks/noop.py (tasks without a driver), drivers/events.py (what a driver's
events become for the JobManager). One lock, this class's, guards them all.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.taskmanager.drivers.events import ENDINGS
from services.taskmanager.drivers.process import DriverProcess
from services.taskmanager.drivers.supply import DriverLaunch, DriverSupply
from services.taskmanager.drivers.warm_pool import WarmPool
from services.taskmanager.tasks.held_reports import HeldReports
from services.taskmanager.tasks.noop import NOOP_KIND, NoopRunner, NoopTasks
from services.taskmanager.tasks.record import Task
from services.taskmanager.tasks.reports import TaskReports
from services.taskmanager.tasks.slot_table import SlotTable
from services.taskmanager.tasks.startup import (
    DEFAULT_STARTUP_TIMEOUT_S,
    StartupWatch,
    driver_start_timeout_s,
    startup_timeout_s,
)
from shared import task_protocol as tp
from shared.ids import ExecutionId, JobId, TaskManagerId
from shared.messages import DeployTask, SlotState, TaskReport, TriggerCheckpoint
from shared.states import ExecutionState as ES
from shared.transport.base import Transport

if TYPE_CHECKING:
    from services.taskmanager.metrics import TaskMetrics

log = logging.getLogger("headrace.taskmanager")


class TaskSupervisor:
    def __init__(self, *, taskmanager_id: TaskManagerId, slots: int, transport: Transport, workdir: Path,
                 cancel_timeout_s: float, noop: NoopRunner, drivers: DriverLaunch | None = None,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S, reports: HeldReports | None = None,
                 metrics: TaskMetrics | None = None) -> None:
        self.taskmanager_id = taskmanager_id
        self.cancel_timeout_s = cancel_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.noop = noop
        self.drivers = DriverSupply(drivers, taskmanager_id=taskmanager_id, workdir=workdir,
                                    on_event=self._on_driver_event, on_exit=self._on_driver_exit,
                                    status_client=transport.redis_client)
        self.slots = SlotTable(slots)
        self.tasks: dict[ExecutionId, Task] = {}
        self._lock = threading.RLock()
        self.startup = StartupWatch(lock=self._lock, still_starting=self._still_starting, fail=self._fail)
        held = reports or HeldReports(transport)  # shared by the process's TaskManagers
        self.reports = TaskReports(taskmanager_id=taskmanager_id, transport=transport, held=held, metrics=metrics)
        self.noop_tasks = NoopTasks(noop, taskmanager_id=taskmanager_id, transport=transport, reports=held,
                                    on_state=self._on_noop_state, on_startup_timeout=self.startup.expired,
                                    finish=self._finish, decline=self.reports.declined)

    @property
    def warm(self) -> WarmPool | None:
        """The warm pool (services/taskmanager/drivers/warm_pool.py), None without one."""
        return self.drivers.warm

    def start(self) -> None:
        """Start warming up the drivers the free slots may want."""
        self._replenish()

    # --- commands ----------------------------------------------------------------------

    def deploy(self, cmd: DeployTask) -> None:
        spec = cmd.spec
        with self._lock:
            if spec.execution_id in self.tasks:
                return  # a redelivered command
            busy = self.slots.taken_by_others(cmd.slot_indices, cmd.allocation_id)
            if busy:
                self.reports.state(spec, ES.FAILED, cause=f"slots {busy} of {self.taskmanager_id} are not free",
                                   name="SlotOccupiedException")
                return
            self.slots.take(cmd.slot_indices, cmd.allocation_id)
            task = Task(spec=spec, allocation_id=cmd.allocation_id, slots=tuple(cmd.slot_indices),
                        startup_timeout_s=startup_timeout_s(spec.config, self.startup_timeout_s))
            self.tasks[spec.execution_id] = task
        try:
            self._start(task)
        except Exception as exc:  # whatever broke, the attempt fails and frees its slots
            log.exception("task %s could not be started", spec.execution_id)
            with self._lock:
                task.cancel_requested = True
                driver = task.driver
            self._fail(task, type(exc).__name__, f"the task could not be started on {self.taskmanager_id}: {exc}")
            if driver is not None:
                driver.kill()

    def _start(self, task: Task) -> None:
        spec = task.spec
        noop = self._noop_of(task)
        if noop is not None:
            noop.start(task)
            return
        with self._lock:
            driver, kind = self.drivers.for_task(spec)
            driver.execution_id = spec.execution_id
            task.driver = driver
        log.info("task %s (job %s attempt %d) on %s driver %s", spec.execution_id, spec.job_id, spec.attempt,
                 kind, driver.id)
        try:
            self.reports.state(spec, ES.INITIALIZING)  # taken: the deploy is acknowledged
        except Exception:  # best effort: RUNNING acknowledges it too
            log.warning("could not report task %s INITIALIZING", spec.execution_id, exc_info=True)
        if driver.ready.is_set():
            self._hand_over(task)
        else:
            # The driver gets its task when it reports ready (see _on_driver_event), unless it
            # never does; a warm driver taken while warming up skips the rest of its warm-up.
            driver.hurry()
            self.startup.arm(task, driver_start_timeout_s(task.startup_timeout_s), waiting_for_driver=True)
        self._replenish()

    def cancel(self, execution_id: ExecutionId, job_id: JobId | None = None) -> None:
        with self._lock:
            task = self.tasks.get(execution_id)
            if task is None:
                if job_id:
                    self.reports.canceled_elsewhere(execution_id, job_id)
                return
            if task.reported_terminal:
                return
            task.cancel_requested = True
            noop = self._noop_of(task)
            if noop is not None:
                noop.cancel(task)
                return
            driver = task.driver
            task.state = ES.CANCELING
        if driver is not None:
            if not driver.send(tp.CancelRun()):
                driver.terminate()
            # Graceful first (the query stops at a batch boundary), forceful after the timeout.
            timer = threading.Timer(self.cancel_timeout_s, self._force_kill, args=(execution_id,))
            timer.daemon = True
            timer.start()

    def trigger_checkpoint(self, cmd: TriggerCheckpoint) -> None:
        """Hand a checkpoint or savepoint trigger to the task's driver; the driver answers with
        a snapshot_taken or snapshot_declined event. Anything that cannot even reach a driver is
        declined here, so the JobManager never waits for its timeout in silence."""
        with self._lock:
            task = self.tasks.get(cmd.execution_id)
            state = task.state if task else None
        if task is None or task.reported_terminal or task.cancel_requested:
            self.reports.declined(cmd, f"task {cmd.execution_id} is not running on {self.taskmanager_id}")
            return
        noop = self._noop_of(task)
        if noop is not None:
            noop.snapshot(task, cmd)
            return
        driver = task.driver
        if state != ES.RUNNING or driver is None:
            self.reports.declined(cmd, f"task {cmd.execution_id} is {state.value if state else 'unknown'}, "
                                       f"not RUNNING yet")
            return
        if not driver.send(tp.TakeSnapshot(checkpoint_id=cmd.checkpoint_id, kind=cmd.kind, target=cmd.target,
                                           stop_after=cmd.stop_after, drain=cmd.drain)):
            self.reports.declined(cmd, "the task's Spark driver process does not accept commands (it is exiting)")

    def _force_kill(self, execution_id: ExecutionId) -> None:
        with self._lock:
            task = self.tasks.get(execution_id)
            driver = task.driver if task else None
        if driver is not None and driver.alive():
            log.warning("task %s did not stop within %.0f s; killing its driver", execution_id, self.cancel_timeout_s)
            driver.kill()

    # --- driver events -----------------------------------------------------------------

    def _hand_over(self, task: Task) -> None:
        # Called from the deploy path and from the driver's Ready event: exactly once.
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

    def _still_starting(self, task: Task) -> bool:
        with self._lock:
            return (self.tasks.get(task.spec.execution_id) is task and not task.reported_terminal
                    and not task.cancel_requested and task.state not in (ES.RUNNING, ES.CANCELING))

    def _noop_of(self, task: Task) -> NoopTasks | None:
        """Where no-op tasks part from the others: every branch for them asks here."""
        return self.noop_tasks if task.spec.kind == NOOP_KIND else None

    def _task_of(self, driver: DriverProcess) -> Task | None:
        return self.tasks.get(driver.execution_id) if driver.execution_id else None

    def _on_driver_event(self, driver: DriverProcess, event: Any) -> None:
        with self._lock:
            task = self._task_of(driver)
        if task is None:
            if isinstance(event, tp.Ready):
                log.info("warm driver %s ready after %.1f s", driver.id, event.startup_s)
                self.publish_warm_status()
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

    def _on_driver_exit(self, driver: DriverProcess, code: int) -> None:
        self.drivers.forget(driver)
        with self._lock:
            task = self._task_of(driver)
        if task is not None:
            # The attempt's live Spark checkpoint is never used again (a restart starts from a
            # copy of a completed snapshot, whose state files are hard links that survive this).
            live = task.spec.checkpoint_dir
            threading.Thread(target=shutil.rmtree, args=(live,), kwargs={"ignore_errors": True},
                             name="live-dir-cleanup", daemon=True).start()
        if task is not None and not task.reported_terminal:
            if task.cancel_requested:
                self._finish(task, ES.CANCELED)
            elif driver.exit_reason is not None:  # ended by this TaskManager (its memory limit)
                self._fail(task, driver.exit_reason[0], driver.exit_reason[1])
            else:
                self._fail(task, "DriverProcessExited",
                           f"Spark driver process exited with code {code} before the task ended; "
                           f"last lines of {driver.log_path}:\n{driver.log_tail()}")
        self._replenish()

    def _on_noop_state(self, task: Task, state: ES, cause: str | None) -> None:
        if state.is_terminal:
            self._finish(task, state, cause=cause, name="NoopTaskFailure" if cause else None)
        else:
            with self._lock:
                task.state = state
            self.reports.state(task.spec, state)

    # --- bookkeeping -------------------------------------------------------------------

    def _fail(self, task: Task, name: str, cause: str) -> None:
        self._finish(task, ES.FAILED, name=name, cause=cause)

    def _finish(self, task: Task, state: ES, *, cause: str | None = None, name: str | None = None) -> None:
        with self._lock:
            if task.reported_terminal:
                return
            task.reported_terminal = True
            task.state = state
            self.tasks.pop(task.spec.execution_id, None)
            if task.startup_timer is not None:
                task.startup_timer.cancel()
            self.slots.release(task.slots, task.allocation_id)
        self.reports.ended(task.spec, state, cause=cause, name=name)
        self._replenish()

    def _replenish(self) -> None:
        self.drivers.replenish(self.free_slots())

    def publish_warm_status(self) -> None:
        """For operators and benchmarks: how many warm drivers are ready right now; and the warm
        drivers' size kept to the tasks that may fail over here."""
        self.drivers.follow_standby_shape(len(self.slots))
        self.drivers.publish_status()

    def free_slots(self) -> int:
        with self._lock:
            return self.slots.free()

    def task_drivers(self) -> list[tuple[tp.TaskSpec, DriverProcess]]:
        """Each task that has a driver, with it (memory/task_memory.py reads their memory figures)."""
        with self._lock:
            return [(t.spec, t.driver) for t in self.tasks.values() if t.driver is not None]

    def slot_report(self) -> tuple[SlotState, ...]:
        with self._lock:
            by_alloc = {t.allocation_id: t for t in self.tasks.values()}
            out = []
            for i, a in self.slots.holders():
                t = by_alloc.get(a) if a else None
                out.append(SlotState(index=i, allocation_id=a, job_id=t.spec.job_id if t else None,
                                     execution_id=t.spec.execution_id if t else None))
            return tuple(out)

    def abandon_tasks(self, why: str) -> int:
        """Cancel every task here: they were failed over elsewhere. Returns how many."""
        with self._lock:
            ids = [(t.spec.execution_id, t.spec.job_id) for t in self.tasks.values() if not t.reported_terminal]
        for execution_id, job_id in ids:
            log.warning("stopping task %s of job %s: %s", execution_id, job_id, why)
            self.cancel(execution_id, job_id)
        return len(ids)

    def running_reports(self) -> tuple[TaskReport, ...]:
        with self._lock:
            return tuple(TaskReport(execution_id=t.spec.execution_id, job_id=t.spec.job_id, state=t.state,
                                    allocation_id=t.allocation_id) for t in self.tasks.values())

    def shutdown(self) -> None:
        """Stop everything this TaskManager started; nothing may outlive it."""
        self.drivers.shutdown()  # first, so the task drivers' exits below start no replacements
        with self._lock:
            drivers = [t.driver for t in self.tasks.values() if t.driver]
        for d in drivers:
            d.kill()
        self.noop.shutdown()
