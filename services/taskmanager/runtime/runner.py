"""Spark driver process: one warm slot that runs exactly one task (see shared/task_protocol.py).

    python -m services.taskmanager.runtime.runner --parallelism P --workdir DIR --events-fd FD
        [--driver-memory 1g] [--shuffle-partitions N]

Lifecycle: build a local[P] SparkSession -> `warming` -> warm it up -> `ready` -> read one RunTask line
from stdin -> `initializing` -> import the pipeline and call `build(ctx)` -> start the returned
sink handle -> `running` -> `progress`* -> `finished` | `failed` | `canceled` -> exit.

This module is the composition root; the rooms it wires together:
  spark_session.py    the SparkSession (also used by class_archive.py)
  warm_up.py          what a driver runs before it reports ready
  driver_io.py        the events fd, the start-up phases in the log, the parent watchdog, exit paths
  pipeline_loader.py  importing the pipeline artifact (.py or .zip)
  driver.py           the task: build, run (batch or streaming), cancel, finish
  restore.py          lineage and restoring a snapshot before the query starts
  snapshots.py        checkpoints and savepoints at micro-batch commits
  reports.py          Progress events and failure texts

Start-up: as a task starts, the driver writes each phase to its log (`PHASE_MARKER`: importing
the module, building, restoring, starting the query) and dumps every thread's stack there on
SIGUSR1, so the TaskManager can say where a pipeline that does not start in time is stuck
(headrace.task.startup-timeout, see services/taskmanager/tasks/startup.py).

Cancel (a `cancel` line on stdin or SIGTERM) stops the query and exits 0 after `canceled`.
A watchdog exits the process when its parent dies, so a killed TaskManager leaves no driver
behind; the JVM follows because it exits when its stdin (held by this process) closes.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

from shared.driver_contract import STACK_DUMP_SIGNAL, WARM_UP_BATCHES, remove_python_socket_dirs
from shared.spark_runtime import SparkRuntime
from shared.task_protocol import TASK_WAITING_MARKER, Canceled, Failed, Ready, RunTask, Warming, decode_command

from . import class_archive, jit_in_reserve
from .cluster_mode import Engine
from .driver import Driver
from .driver_io import EventWriter, end_own_session, start_watchdog, stop_spark_quietly
from .reports import format_failure
from .spark_session import build_spark, prepare_env, spark_ui_wanted
from .warm_up import warm_up, warm_up_driver


class _Terminate(BaseException):
    """Raised by the SIGTERM handler while no task runs: leave quietly."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.taskmanager.runtime.runner")
    p.add_argument("--parallelism", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--events-fd", type=int, required=True)
    p.add_argument("--driver-memory", default="1g")
    p.add_argument("--shuffle-partitions", type=int, default=None, help="default: max(2, parallelism)")
    p.add_argument(
        "--no-warmup", action="store_true", help="a task waits for this driver: no warm-up, no JIT in reserve"
    )
    p.add_argument(
        "--no-warmup-query",
        action="store_true",
        help="in reserve without the warm-up query (Settings.warm_up_query off)",
    )
    p.add_argument(
        "--warm-up-batches",
        type=int,
        default=WARM_UP_BATCHES,
        help="micro-batches of the warm-up query in reserve (Settings.warm_up_batches)",
    )
    p.add_argument("--spark-ui", action="store_true", help="run the Spark UI (the TaskManager's spark_ui setting)")
    p.add_argument(
        "--waiting-marker",
        default=None,
        help="the file whose appearance means a task waits (default: <workdir>/.task-waiting)",
    )
    p.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="the TaskManager's pid: exit once it is no longer the parent (default: the parent at start)",
    )
    p.add_argument("--master", default="local", help="local, or a standalone master URL spark://host:port")
    p.add_argument("--executor-cores", type=int, default=1)
    p.add_argument("--executor-memory", default="1g")
    p.add_argument(
        "--executor-timeout",
        type=float,
        default=300.0,
        help="seconds a task's work may wait for its first executor before it fails",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address executors reach this driver at")
    SparkRuntime.add_arguments(p)
    p.add_argument(
        "--python-forkserver",
        action="store_true",
        help="local engine: start Spark's per-query Python source runner from a preloaded fork "
        "server (python_forkserver.py)",
    )
    return p.parse_args(argv)


def engine_of(args: argparse.Namespace) -> Engine:
    return Engine(
        master=args.master,
        executor_cores=args.executor_cores,
        executor_memory=args.executor_memory,
        executor_timeout_s=args.executor_timeout,
        host=args.host,
    )


class _Process:
    """What the signal handler and the watchdog act on: the session and driver once they exist."""

    def __init__(self) -> None:
        self.spark: Any = None
        self.driver: Driver | None = None

    def orphaned(self) -> None:
        print("parent process died: exiting", file=sys.stderr, flush=True)
        stop_spark_quietly(self.spark, 3.0)
        end_own_session()
        os._exit(1)

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        d = self.driver
        if d is not None and d.task_started:
            d.request_cancel()
        else:
            raise _Terminate()


def start_session(
    args: argparse.Namespace, engine: Engine, on_session_up: Callable[[], None] = lambda: None
) -> tuple[Any, jit_in_reserve.OptimizerInReserve | None]:
    """The warm SparkSession this driver offers, and the JIT optimizer held in reserve meanwhile.
    `on_session_up` is called once the session is built, before its warm-up."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    shuffle = args.shuffle_partitions or max(2, args.parallelism)
    runtime = SparkRuntime.from_args(args)
    # A driver that warms up waits in reserve for a task: its JIT's C2 only on idle CPU until then.
    optimizer = None if args.no_warmup else jit_in_reserve.OptimizerInReserve().start()
    spark = build_spark(
        args.parallelism,
        workdir,
        shuffle_partitions=shuffle,
        driver_memory=args.driver_memory,
        ui=args.spark_ui or spark_ui_wanted(),
        engine=engine,
        extra_java_options=class_archive.runtime_java_options(runtime),
        python_forkserver=args.python_forkserver,
        jars=runtime.jars,
    )
    on_session_up()
    marker = Path(args.waiting_marker) if args.waiting_marker else workdir / TASK_WAITING_MARKER
    if not engine.local and not (args.no_warmup or args.no_warmup_query):
        # Its jobs would take executors from the Spark cluster, and an executor idle after them is
        # kept a minute: a driver in reserve must hold none that a running task could use. What
        # needs no executor is warmed all the same.
        t_w = time.monotonic()
        finished = warm_up_driver(spark, args.parallelism, cut_short=marker.exists)
        print(
            f"in reserve without the warm-up query (executors come from a Spark cluster); driver warm-up "
            f"{'took' if finished else 'cut short after'} {time.monotonic() - t_w:.2f}s",
            flush=True,
        )
    elif not engine.local and not args.no_warmup:
        print("in reserve without the warm-up query (executors come from a Spark cluster)", flush=True)
    elif not (args.no_warmup or args.no_warmup_query):
        t_w, steps = time.monotonic(), list[str]()
        if warm_up(spark, workdir, args.parallelism, marker.exists, args.warm_up_batches, steps):
            print(f"warm-up took {time.monotonic() - t_w:.2f}s ({args.warm_up_batches} micro-batches)", flush=True)
        else:
            print(
                f"warm-up cut short after {time.monotonic() - t_w:.2f}s, in {steps[-1] if steps else 'its start'}: "
                f"a task is waiting (since {marker_age(marker)})",
                flush=True,
            )
    elif args.no_warmup_query:
        print("in reserve without the warm-up query (warm_up_query is off)", flush=True)
    return spark, optimizer


def marker_age(marker: Path) -> str:
    """How long ago the TaskManager said a task waits: what the cut itself cost the task."""
    try:
        return f"{max(0.0, time.time() - marker.stat().st_mtime):.2f}s"
    except OSError:
        return "an unknown time"


def run_one_task(
    driver: Driver, events: EventWriter, stdin: IO[str], optimizer: jit_in_reserve.OptimizerInReserve | None
) -> int:
    """Wait for the task on stdin and run it; the exit code of the process."""
    line = stdin.readline()
    if not line.strip():
        return 0  # stdin closed before any task: the slot is being discarded
    driver.task_started = True
    try:
        cmd = decode_command(line)
    except Exception as e:  # noqa: BLE001 - reported as the task's failure
        events.emit(Failed(error_name=type(e).__name__, traceback=format_failure(e)))
        return 1
    if not isinstance(cmd, RunTask):
        events.emit(Canceled())
        return 0
    driver.listen_for_cancel(stdin)
    return driver.run(cmd.spec)


_PR_SET_DUMPABLE = 4


def not_dumpable() -> None:
    """Make this process non-dumpable before anything secret reaches it (the RunTask line holds
    the task's configuration and the pipeline's Redis password): its /proc/<pid>/mem, environ and
    the like become root's, so no other process, not even one of the same user, reads them, and
    no core dump is written. The TaskManager still reads its memory figure as root
    (services/taskmanager/memory/measure.py). Linux only; elsewhere nothing happens."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    not_dumpable()
    t0 = time.monotonic()
    args = parse_args(argv)
    engine = engine_of(args)
    prepare_env(engine.host)
    events = EventWriter(args.events_fd)
    process = _Process()
    signal.signal(signal.SIGTERM, process.on_sigterm)
    # Into the log (stderr): works even while the main thread is stuck in C code.
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    start_watchdog(process.orphaned, parent=args.parent_pid)
    code = 0
    try:
        process.spark, optimizer = start_session(
            args, engine, lambda: events.emit(Warming(startup_s=round(time.monotonic() - t0, 3)))
        )
        process.driver = Driver(events, process.spark, args.parallelism, engine)
        events.emit(Ready(pid=os.getpid(), parallelism=args.parallelism, startup_s=round(time.monotonic() - t0, 3)))
        code = run_one_task(process.driver, events, sys.stdin, optimizer)
    except _Terminate:
        code = 0
    except BaseException:  # noqa: BLE001 - logged; the process exits 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        stop_spark_quietly(process.spark, 15.0)
        remove_python_socket_dirs(args.workdir)
        # Py4J and stdin threads must not keep a finished driver alive.
        os._exit(code)
    return code


if __name__ == "__main__":
    main()
