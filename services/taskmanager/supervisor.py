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
like any other failure (restart strategy). A driver that is not ready DRIVER_START_TIMEOUT_S after
it was handed a task fails it the same way. A deploy that breaks before its task starts (an
option the task cannot read, a driver that cannot be started) fails the attempt and frees its
slots, rather than leaving it DEPLOYING.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from services.taskmanager.driver_events import ENDINGS, FORWARDED
from services.taskmanager.driver_process import DriverProcess
from services.taskmanager.driver_sandbox import DriverSandbox
from services.taskmanager.held_reports import HeldReports
from services.taskmanager.noop_task import NoopRunner
from services.taskmanager.noop_tasks import NOOP_KIND, NoopTasks
from services.taskmanager.startup_timeout import (
    DEFAULT_STARTUP_TIMEOUT_S,
    DRIVER_START_TIMEOUT_S,
    STACK_DUMP_WAIT_S,
    STARTUP_TIMEOUT_NAME,
    startup_timeout_cause,
    startup_timeout_s,
)
from services.taskmanager.warm_pool import WarmPool
from shared import streams
from shared import task_protocol as tp
from shared.messages import CheckpointDeclined, DeployTask, SlotState, TaskReport, TaskStateChanged, TriggerCheckpoint
from shared.states import ExecutionState as ES
from shared.transport.base import Transport

if TYPE_CHECKING:
    from services.taskmanager.metrics import TaskMetrics

log = logging.getLogger("headrace.taskmanager")


@dataclass(frozen=True)
class DriverLaunch:
    """How a TaskManager starts its Spark driver processes (none for simulated TaskManagers)."""

    driver_memory: str
    shuffle_partitions: int
    engine_args: Callable[[dict | None], list[str]]  # a job's configuration -> the runner's arguments
    sandbox: DriverSandbox | None
    # The warm pool, given the supervisor's driver factory; None: every task gets a cold driver.
    warm_pool: Callable[[Callable[..., DriverProcess]], WarmPool] | None = None


@dataclass
class Task:
    spec: tp.TaskSpec
    allocation_id: str
    slots: tuple[int, ...]
    state: ES = ES.DEPLOYING
    driver: DriverProcess | None = None
    cancel_requested: bool = False
    reported_terminal: bool = False
    handed_over: bool = False
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    startup_timer: threading.Timer | None = None


class TaskSupervisor:
    def __init__(self, *, taskmanager_id: str, slots: int, transport: Transport, workdir: Path,
                 cancel_timeout_s: float, noop: NoopRunner, drivers: DriverLaunch | None = None,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S, reports: HeldReports | None = None,
                 metrics: TaskMetrics | None = None) -> None:
        self.taskmanager_id, self.transport, self.workdir = taskmanager_id, transport, workdir
        self.cancel_timeout_s = cancel_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.drivers, self.noop, self.metrics = drivers, noop, metrics
        self.warm = drivers.warm_pool(self._new_driver) if drivers is not None and drivers.warm_pool else None
        self.status_client = transport.redis_client
        self.slots: dict[int, str | None] = {i: None for i in range(slots)}
        self.tasks: dict[str, Task] = {}
        self._lock = threading.RLock()
        self.reports = reports or HeldReports(transport)  # shared by the process's TaskManagers
        self.noop_tasks = NoopTasks(noop, taskmanager_id=taskmanager_id, transport=transport, reports=self.reports,
                                    on_state=self._on_noop_state, on_startup_timeout=self._startup_expired,
                                    finish=self._finish, decline=self._decline)

    def start(self) -> None:
        """Start warming up the drivers the free slots may want."""
        self._replenish()

    # --- commands ----------------------------------------------------------------------

    def deploy(self, cmd: DeployTask) -> None:
        spec = tp.TaskSpec.model_validate(cmd.spec)
        with self._lock:
            if spec.execution_id in self.tasks:
                return  # a redelivered command
            busy = [i for i in cmd.slot_indices if self.slots.get(i, "missing") not in (None, cmd.allocation_id)]
            if busy:
                self._report(spec, ES.FAILED, cause=f"slots {busy} of {self.taskmanager_id} are not free",
                             name="SlotOccupiedException")
                return
            for i in cmd.slot_indices:
                self.slots[i] = cmd.allocation_id
            task = Task(spec=spec, allocation_id=cmd.allocation_id, slots=tuple(cmd.slot_indices),
                        startup_timeout_s=startup_timeout_s(spec.config, self.startup_timeout_s))
            self.tasks[spec.execution_id] = task
        try:
            self._start(task)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the attempt fails and frees its slots
            log.exception("task %s could not be started", spec.execution_id)
            with self._lock:
                task.cancel_requested = True
                driver = task.driver
            self._finish(task, ES.FAILED, name=type(exc).__name__,
                         cause=f"the task could not be started on {self.taskmanager_id}: {exc}")
            if driver is not None:
                driver.kill()

    def _start(self, task: Task) -> None:
        spec = task.spec
        noop = self._noop_of(task)
        if noop is not None:
            noop.start(task)
            return
        with self._lock:
            # A job that sets its executors' size needs a driver started with it.
            own_executors = any(k in (spec.config or {}) for k in ("spark.executor.cores", "spark.executor.memory"))
            driver = self.warm.take(spec.parallelism) if self.warm and not own_executors else None
            kind = "a warm" if driver is not None and driver.ready.is_set() else \
                "a starting warm" if driver is not None else "a cold"
            if driver is None:
                driver = self._new_driver(spec.parallelism, for_task=True, config=spec.config)
            driver.execution_id = spec.execution_id
            task.driver = driver
        log.info("task %s (job %s attempt %d) on %s driver %s", spec.execution_id, spec.job_id, spec.attempt,
                 kind, driver.id)
        try:
            self._report(spec, ES.INITIALIZING)  # taken: the deploy is acknowledged
        except Exception:  # noqa: BLE001 - best effort: RUNNING acknowledges it too
            log.warning("could not report task %s INITIALIZING", spec.execution_id, exc_info=True)
        if driver.ready.is_set():
            self._hand_over(task)
        else:
            # The driver gets its task when it reports ready (see _on_driver_event), unless it
            # never does.
            self._arm_startup_timer(task, DRIVER_START_TIMEOUT_S, waiting_for_driver=True)
        self._replenish()

    def cancel(self, execution_id: str, job_id: str | None = None) -> None:
        with self._lock:
            task = self.tasks.get(execution_id)
            if task is None:
                if job_id:
                    # Not running here (finished meanwhile, or lost with a predecessor process):
                    # answer anyway, so a job waiting in CANCELLING can end.
                    self.transport.publish(streams.JM_STREAM, TaskStateChanged(
                        execution_id=execution_id, job_id=job_id, taskmanager_id=self.taskmanager_id,
                        state=ES.CANCELED))
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
            self._decline(cmd, f"task {cmd.execution_id} is not running on {self.taskmanager_id}")
            return
        noop = self._noop_of(task)
        if noop is not None:
            noop.snapshot(task, cmd)
            return
        if state != ES.RUNNING or task.driver is None:
            self._decline(cmd, f"task {cmd.execution_id} is {state.value if state else 'unknown'}, not RUNNING yet")
            return
        if not task.driver.send(tp.TakeSnapshot(checkpoint_id=cmd.checkpoint_id, kind=cmd.kind, target=cmd.target,
                                                stop_after=cmd.stop_after, drain=cmd.drain)):
            self._decline(cmd, "the task's Spark driver process does not accept commands (it is exiting)")

    def _decline(self, cmd: TriggerCheckpoint, reason: str) -> None:
        log.warning("declining checkpoint %d of %s: %s", cmd.checkpoint_id, cmd.execution_id, reason)
        self.transport.publish(streams.JM_STREAM, CheckpointDeclined(
            job_id=cmd.job_id, execution_id=cmd.execution_id, taskmanager_id=self.taskmanager_id,
            checkpoint_id=cmd.checkpoint_id, reason=reason))

    def _force_kill(self, execution_id: str) -> None:
        with self._lock:
            task = self.tasks.get(execution_id)
            driver = task.driver if task else None
        if driver is not None and driver.alive():
            log.warning("task %s did not stop within %.0f s; killing its driver", execution_id, self.cancel_timeout_s)
            driver.kill()

    # --- driver events -----------------------------------------------------------------

    def _new_driver(self, parallelism: int, for_task: bool = False, config: dict | None = None) -> DriverProcess:
        """A started driver process; `for_task`: a task waits for it (no warm-up query first)."""
        launch = self.drivers
        if launch is None:
            raise RuntimeError(f"{self.taskmanager_id} is simulated: it runs no-op tasks only")
        return DriverProcess(parallelism=parallelism, workdir=self.workdir / "drivers",
                             driver_memory=launch.driver_memory, shuffle_partitions=launch.shuffle_partitions,
                             on_event=self._on_driver_event, on_exit=self._on_driver_exit,
                             engine_args=launch.engine_args(config), warm_up=not for_task,
                             sandbox=launch.sandbox).start()

    def _hand_over(self, task: Task) -> None:
        # Called from the deploy path and from the driver's Ready event: exactly once.
        with self._lock:
            if task.handed_over:
                return
            task.handed_over = True
        if task.cancel_requested:
            task.driver.kill()
            return
        if not task.driver.run_task(task.spec):
            task.driver.kill()  # the exit handler reports the failure
            return
        # Counted from here: the time a cold driver takes to start is not the pipeline's.
        self._arm_startup_timer(task, task.startup_timeout_s)

    def _arm_startup_timer(self, task: Task, timeout_s: float, *, waiting_for_driver: bool = False) -> None:
        timer = threading.Timer(timeout_s, self._startup_expired, args=(task, timeout_s, waiting_for_driver))
        timer.daemon = True
        with self._lock:
            previous, task.startup_timer = task.startup_timer, timer
        if previous is not None:
            previous.cancel()
        timer.start()

    def _startup_expired(self, task: Task, timeout_s: float | None = None, waiting_for_driver: bool = False) -> None:
        """The task is not RUNNING `timeout_s` after its driver got it (or its driver is still
        not ready): fail it with where it was, and stop it."""
        if not self._still_starting(task) or (waiting_for_driver and task.handed_over):
            return
        timeout_s = task.startup_timeout_s if timeout_s is None else timeout_s
        driver = task.driver
        advice = None
        if driver is None:  # a no-op task (noop.startup-delay)
            phase, where = "starting (a no-op task whose noop.startup-delay is longer)", ""
        elif not task.handed_over:
            phase = "waiting for its Spark driver process to start"
            advice = "The driver's JVM or Spark did not come up: see its log (memory, Java, Spark install)"
            where = f"The driver's last log lines ({driver.log_path}):\n{driver.log_tail(40)}"
        else:
            driver.dump_stacks()  # into its log, read below
            time.sleep(STACK_DUMP_WAIT_S)
            phase, logged = driver.startup_report()
            phase = phase or "importing or building the pipeline"
            where = f"Where it was (the driver's thread dump and log since, from {driver.log_path}):\n{logged}"
        with self._lock:
            if not self._still_starting(task):
                return  # it started while the stacks were dumped
            # Its driver's exit is this failure, not another one; a no-op task's timers stop.
            task.cancel_requested = True
        log.warning("task %s (job %s attempt %d) did not start within %g s; stopping it", task.spec.execution_id,
                    task.spec.job_id, task.spec.attempt, timeout_s)
        self._finish(task, ES.FAILED, name=STARTUP_TIMEOUT_NAME,
                     cause=startup_timeout_cause(timeout_s, phase, where, advice))
        if driver is not None:
            driver.kill()

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
        forward = FORWARDED.get(type(event))
        if forward is not None:
            if isinstance(event, tp.Progress) and self.metrics is not None:
                self.metrics.progress(self.taskmanager_id, task.spec, event)
            self.transport.publish(streams.JM_STREAM, forward(task.spec, self.taskmanager_id, event))
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
        self._report(task.spec, ES.RUNNING)

    def _on_driver_exit(self, driver: DriverProcess, code: int) -> None:
        if self.warm:
            self.warm.forget(driver)
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
                self._finish(task, ES.FAILED, name=driver.exit_reason[0], cause=driver.exit_reason[1])
            else:
                self._finish(task, ES.FAILED, name="DriverProcessExited",
                             cause=f"Spark driver process exited with code {code} before the task ended; "
                                   f"last lines of {driver.log_path}:\n{driver.log_tail()}")
        self._replenish()

    def _on_noop_state(self, task: Task, state: ES, cause: str | None) -> None:
        if state.is_terminal:
            self._finish(task, state, cause=cause, name="NoopTaskFailure" if cause else None)
        else:
            with self._lock:
                task.state = state
            self._report(task.spec, state)

    # --- bookkeeping -------------------------------------------------------------------

    def _finish(self, task: Task, state: ES, *, cause: str | None = None, name: str | None = None) -> None:
        with self._lock:
            if task.reported_terminal:
                return
            task.reported_terminal = True
            task.state = state
            self.tasks.pop(task.spec.execution_id, None)
            if task.startup_timer is not None:
                task.startup_timer.cancel()
            for i in task.slots:
                if self.slots.get(i) == task.allocation_id:
                    self.slots[i] = None
        if self.metrics is not None:
            self.metrics.forget(self.taskmanager_id, task.spec)
        self._report(task.spec, state, cause=cause, name=name)
        self._replenish()

    def _report(self, spec: tp.TaskSpec, state: ES, *, cause: str | None = None, name: str | None = None) -> None:
        self.reports.publish(streams.JM_STREAM, TaskStateChanged(
            execution_id=spec.execution_id, job_id=spec.job_id, taskmanager_id=self.taskmanager_id, state=state,
            failure_cause=cause, failure_name=name))

    def _replenish(self) -> None:
        if self.warm is not None:
            self.warm.replenish(self.free_slots())
            self.publish_warm_status()

    def publish_warm_status(self) -> None:
        """For operators and benchmarks: how many warm drivers are ready right now."""
        if self.warm is None or self.status_client is None:
            return
        try:
            self.status_client.set(streams.tm_warm_key(self.taskmanager_id), json.dumps(self.warm.status()), ex=60)
        except Exception:  # noqa: BLE001 - status is best effort
            log.debug("could not publish warm status", exc_info=True)

    def free_slots(self) -> int:
        with self._lock:
            return sum(1 for a in self.slots.values() if a is None)

    def slot_report(self) -> tuple[SlotState, ...]:
        with self._lock:
            by_alloc = {t.allocation_id: t for t in self.tasks.values()}
            out = []
            for i, a in sorted(self.slots.items()):
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
        if self.warm:
            self.warm.shutdown()  # first, so the task drivers' exits below start no replacements
        with self._lock:
            drivers = [t.driver for t in self.tasks.values() if t.driver]
        for d in drivers:
            d.kill()
        self.noop.shutdown()
