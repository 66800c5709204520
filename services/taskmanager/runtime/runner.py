"""Spark driver process: one warm slot that runs exactly one task (see shared/task_protocol.py).

    python -m services.taskmanager.runtime.runner --parallelism P --workdir DIR --events-fd FD
        [--driver-memory 1g] [--shuffle-partitions N]

Lifecycle: build a local[P] SparkSession and warm it up -> `ready` -> read one RunTask line
from stdin -> `initializing` -> import the pipeline and call `build(ctx)` -> start the returned
sink handle -> `running` -> `progress`* -> `finished` | `failed` | `canceled` -> exit.

Pipeline artifacts: a `.py` file is imported as a module named after the file; a `.zip` is put
on sys.path (and shipped to Python workers) and the module `spec.config["module"]` is imported,
or, without that key, the zip's single top-level module or package. The entry function
`spec.entry` (default `build`) is called with a `PipelineContext`.

Streaming finish rule: a query whose sources are all bounded (registered by ctx.sources.* with a
bound) finishes once the committed end offset of every source reached its bound; the runner
then lets Spark run the pending no-data batch (watermark advance) and stops the query. Queries
with an unbounded source run until canceled.

Checkpoints (a `snapshot` line on stdin, see shared/task_protocol.py): the barrier is a
micro-batch commit. The request remembers the batch Spark had planned when it arrived and is
served at the first commit at or after it, by copying the live Spark checkpoint at that batch
into the target directory (shared/checkpoint_storage.py); `stop_after` stops the query first and
snapshots its last committed batch (stop-with-savepoint). Restore: an attempt with
`restore_from` starts from a copy of that snapshot in its own live directory, after the
compatibility check (plan_signature.py) and after every sink fenced off older attempts.

Start-up: as a task starts, the driver writes each phase to its log (`PHASE_MARKER`: importing
the module, building, restoring, starting the query) and dumps every thread's stack there on
SIGUSR1, so the TaskManager can say where a pipeline that does not start in time is stuck
(headrace.task.startup-timeout, see services/taskmanager/supervisor.py).

Cancel (a `cancel` line on stdin or SIGTERM) stops the query and exits 0 after `canceled`.
A watchdog exits the process when its parent dies, so a killed TaskManager leaves no driver
behind; the JVM follows because it exits when its stdin (held by this process) closes.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
import zipfile
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Callable

from services.taskmanager.driver_process import PHASE_MARKER, STACK_DUMP_SIGNAL
from shared import checkpoint_storage as storage
from shared import restore_failure
from shared.task_protocol import (
    Canceled,
    Failed,
    Finished,
    Initializing,
    Progress,
    Ready,
    Running,
    RunTask,
    SnapshotDeclined,
    SnapshotTaken,
    TakeSnapshot,
    TaskSpec,
    decode_command,
    encode_line,
    snapshot_metadata,
)

from . import class_archive, jit_in_reserve
from .cluster_mode import Engine, ExecutorWatch, NoExecutors

REPO_ROOT = Path(__file__).resolve().parents[3]
# Set by the TaskManager when its `spark_ui` setting is on (services/taskmanager/__main__.py).
SPARK_UI_ENV = "HEADRACE_SPARK_UI"
POLL_S = 0.25
DRAIN_TIMEOUT_S = 300.0


class _Terminate(BaseException):
    """Raised by the SIGTERM handler while no task runs: leave quietly."""


_task_t0: list[float] = []  # when the task arrived, for the timings in the log


def announce_phase(phase: str) -> None:
    """Tell the log (and through it the TaskManager) what the starting task is doing, and when
    (seconds since the task arrived): where a slow start spends its time."""
    at = f" (+{time.monotonic() - _task_t0[0]:.3f} s)" if _task_t0 else ""
    print(f"{PHASE_MARKER}{phase}{at}", flush=True)


# ---------------------------------------------------------------- spark session

def prepare_env(host: str = "127.0.0.1") -> None:
    """Environment every Spark process of ours needs; must run before the JVM starts. `host`:
    the address this driver listens on (executors on other machines connect to it)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = host
    # Python workers are spawned by the JVM with its environment: they must be able to import
    # `services.*` to unpickle our data sources.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])


def spark_ui_wanted(environ=os.environ) -> bool:
    return environ.get(SPARK_UI_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def build_spark(parallelism: int, workdir: str | Path, *, shuffle_partitions: int = 2,
                driver_memory: str = "1g", app_name: str = "headrace-driver", ui: bool = False,
                engine: Engine = Engine(), extra_java_options: str = "", python_forkserver: bool = False):
    """A SparkSession whose scratch files all live under `workdir` (the caller cleans it): local,
    or a driver of a standalone cluster (`engine`, cluster_mode.py). `ui`: run the Spark UI on a
    free port (several drivers share a host); its kill links are off, a task is cancelled
    through Headrace. `extra_java_options`: for the driver's JVM only (class_archive.py).
    `python_forkserver`: with a local engine, Spark's Python processes start through a fork
    server's launcher (python_forkserver.py); executors elsewhere could not run it."""
    prepare_env(engine.host)
    if python_forkserver and engine.local:
        from . import python_forkserver as forkserver

        launcher, _server = forkserver.start(str(Path(workdir).resolve() / "forkserver"))
        os.environ["PYSPARK_PYTHON"] = launcher  # SparkContext reads it once, when it is created
        # The JVM starts the data source lookup's daemon with the driver's Python.
        os.environ["PYSPARK_DRIVER_PYTHON"] = launcher
    from pyspark.sql import SparkSession

    work = Path(workdir).resolve()
    local_dir, tmp_dir = work / "spark-local", work / "tmp"
    local_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    java_opts = f"-Djava.io.tmpdir={tmp_dir}"
    builder = SparkSession.builder
    for key, value in engine.spark_conf(parallelism).items():
        builder = builder.config(key, value)
    if not engine.local:
        # Executors import Headrace's connectors to unpickle the data sources, as the drivers do.
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    spark = (
        builder.master(engine.master_url(parallelism))
        .appName(app_name)
        .config("spark.local.dir", str(local_dir))
        .config("spark.driver.extraJavaOptions", java_opts + extra_java_options)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.port", "0")
        .config("spark.ui.killEnabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", engine.host)
        .config("spark.driver.bindAddress", engine.host)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    from .connectors import register_data_sources

    register_data_sources(spark)
    return spark


def warm_up(spark, workdir: str | Path, parallelism: int = 1) -> None:
    """Run what the first micro-batch of a task's query would otherwise pay for (measured in
    docs/benchmarks.md, "Submission to first result"): the connectors' imports on the driver
    (SQLAlchemy, the PostgreSQL driver), a shuffle job, then a stateful streaming query shaped
    like most pipelines: a Python data source read with `parallelism` partitions (Spark's Python
    planner and worker daemons, which the task reuses), a watermarked window aggregation with
    several aggregates, and a foreachBatch that collects each batch as Arrow, as the SQL sink
    does (Py4J callback server, Arrow collection, code generation of the aggregation, the state
    store). No RDD job: RDD Python workers run under a daemon of their own that SQL never uses."""
    from pyspark.sql import functions as F

    from . import context  # noqa: F401 - preload the connector modules (SQLAlchemy etc.)
    from .connectors.sql import warm_drivers as warm_sql_drivers

    warm_sql_drivers()
    parts = max(1, parallelism)
    spark.range(64).groupBy((F.col("id") % 4).alias("k")).count().collect()
    cp = Path(workdir) / "warmup-checkpoint"
    q = (
        spark.readStream.format("datagen").option("total", "64").option("partitions", str(parts)).load()
        .withWatermark("event_time", "10 seconds")
        .groupBy(F.window("event_time", "1 minute"), "url")
        .agg(F.count("*").alias("count"), F.max("i").alias("last"))
        .writeStream.foreachBatch(lambda df, _id: df.toArrow())
        .outputMode("update").trigger(availableNow=True)
        .option("checkpointLocation", str(cp)).start()
    )
    q.awaitTermination()


# ---------------------------------------------------------------- protocol plumbing

class EventWriter:
    """Protocol events on a private dup of the events fd.

    The dup is not inheritable and the original is closed, so the JVM and Python workers never
    hold the pipe: the TaskManager sees EOF exactly when this process dies.
    """

    def __init__(self, fd: int):
        new_fd = os.dup(fd)
        if fd == 1:
            os.dup2(2, 1)  # stdout must not mix with protocol lines: send it to the log
        elif fd > 2:
            os.close(fd)
        self._out: IO[bytes] = os.fdopen(new_fd, "wb", buffering=0)
        self._lock = threading.Lock()

    def emit(self, event) -> None:
        with self._lock:
            try:
                self._out.write(encode_line(event))
            except OSError:
                pass  # reader gone: the parent is dying and the watchdog will end us


def start_watchdog(on_orphaned: Callable[[], None], interval: float = 0.5,
                   parent: int | None = None) -> threading.Thread:
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
    from services.taskmanager.driver_process import kill_session

    me = os.getpid()
    if os.getsid(0) == me and os.getpgrp() == me:
        kill_session(me, leader_last=True)


def stop_spark_quietly(spark, timeout: float) -> None:
    """spark.stop() that cannot hang the exit path."""
    if spark is None:
        return
    t = threading.Thread(target=spark.stop, daemon=True)
    t.start()
    t.join(timeout)


# ---------------------------------------------------------------- pipeline loading

def load_pipeline(artifact: str, config: dict[str, Any], spark) -> ModuleType:
    from pyspark import cloudpickle

    path = Path(artifact)
    if not path.exists():
        raise FileNotFoundError(f"pipeline artifact {artifact} does not exist")
    if path.suffix == ".zip":
        module_name = config.get("module") or _single_top_level(path)
        sys.path.insert(0, str(path))
        spark.sparkContext.addPyFile(str(path))  # workers import it by reference
        return importlib.import_module(module_name)
    if path.suffix != ".py":
        raise ValueError(f"pipeline artifact must be a .py or .zip file, not {path.name}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    # Workers cannot import a loose file: functions defined in it travel by value.
    cloudpickle.register_pickle_by_value(module)
    return module


def _single_top_level(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        tops = set()
        for name in z.namelist():
            head = name.split("/", 1)[0]
            if "/" in name and not head.endswith((".dist-info", ".egg-info", "__pycache__")):
                tops.add(head)
            elif name.endswith(".py") and "/" not in name:
                tops.add(name[:-3])
    if len(tops) != 1:
        raise ValueError(
            f"{path.name} holds {sorted(tops) or 'no'} top-level modules: name one with config `module`"
        )
    return tops.pop()


# ---------------------------------------------------------------- the task

class Driver:
    def __init__(self, events: EventWriter, spark, parallelism: int, engine: Engine = Engine()):
        self.events = events
        self.spark = spark
        self.parallelism = parallelism
        self.engine = engine
        self.fatal: BaseException | None = None  # set by a watch that ends the task (NoExecutors)
        self.task_started = False
        self.cancel_requested = threading.Event()
        self._lock = threading.Lock()
        self._query = None
        self._batch_running = False
        self.ctx = None  # the PipelineContext of the task, once built
        self._plan_of: tuple | None = None  # (DataFrame, output mode) whose signature is not read yet
        self._plan: dict | None = None
        self.snapshot_requests: queue.Queue[TakeSnapshot] = queue.Queue()
        self.restored_meta: dict | None = None  # metadata of the snapshot this attempt starts from
        self.lineage: dict = {}
        self.spark_ui = _ui_url(spark)
        self.on_first_batch: Callable[[], None] = lambda: None

    # -- cancellation, from the stdin thread or the SIGTERM handler
    def request_cancel(self) -> None:
        if self.cancel_requested.is_set():
            return
        self.cancel_requested.set()
        threading.Thread(target=self._do_cancel, name="cancel", daemon=True).start()

    def _do_cancel(self) -> None:
        with self._lock:
            query, batch = self._query, self._batch_running
        try:
            if query is not None:
                query.stop()
            elif batch:
                self.spark.sparkContext.cancelAllJobs()
        except Exception:
            traceback.print_exc()

    def listen_for_cancel(self, stdin: IO[str]) -> None:
        def loop() -> None:
            for line in stdin:
                line = line.strip()
                if not line:
                    continue
                if line == "cancel":
                    self.request_cancel()
                    continue
                try:
                    cmd = decode_command(line)
                except Exception:
                    print(f"ignoring unknown command: {line[:200]}", flush=True)
                    continue
                if cmd.cmd == "cancel":
                    self.request_cancel()
                elif isinstance(cmd, TakeSnapshot):
                    self.snapshot_requests.put(cmd)

        threading.Thread(target=loop, name="stdin", daemon=True).start()

    def _starved(self, exc: NoExecutors) -> None:
        """No executor came: end the task as failed (not canceled) with that reason."""
        self.fatal = exc
        print(f"failing the task: {exc}", flush=True)
        with self._lock:
            query = self._query
        try:
            if query is not None:
                query.stop()
            self.spark.sparkContext.cancelAllJobs()
        except Exception:  # noqa: BLE001
            traceback.print_exc()

    # -- running
    def run(self, spec: TaskSpec) -> int:
        _task_t0[:] = [time.monotonic()]
        self.task_started = True
        self.events.emit(Initializing())
        watch = ExecutorWatch(self.spark, self.engine, self.parallelism, self._starved).start()
        try:
            code = self._run(spec)
            if self.fatal is not None:
                raise self.fatal
            return code
        except BaseException as e:  # noqa: BLE001 - every failure is reported, then we exit
            if self.fatal is not None:
                e = self.fatal
            elif self.cancel_requested.is_set():
                self.events.emit(Canceled())
                return 0
            self.events.emit(Failed(error_name=type(e).__name__, traceback=format_failure(e)))
            return 1
        finally:
            watch.stop()

    def _run(self, spec: TaskSpec) -> int:
        """Build and run the task; a failure propagates to run(), which reports it."""
        self._apply_sql_conf(spec.config)
        if spec.restore_from:
            with restore_failure.restoring(spec.restore_from):  # damaged: the JobManager falls back
                self.restored_meta = storage.read_metadata(spec.restore_from)
        self.lineage = lineage_of(spec, self.restored_meta)
        handle = self._build(spec)
        if self.cancel_requested.is_set():
            self.events.emit(Canceled())
            return 0
        if handle.streaming:
            return self._run_streaming(spec, handle)
        return self._run_batch(handle)

    def _build(self, spec: TaskSpec):
        from .connectors import SinkHandle
        from .context import PipelineContext

        if not spec.artifact_path:
            raise ValueError("task has no artifact_path")
        announce_phase(f"importing the pipeline module {Path(spec.artifact_path).name}")
        module = load_pipeline(spec.artifact_path, spec.config, self.spark)
        entry = getattr(module, spec.entry, None)
        if not callable(entry):
            raise AttributeError(f"pipeline {spec.artifact_path} has no function {spec.entry}(ctx)")
        ctx = PipelineContext(
            self.spark, job_id=spec.job_id, job_name=spec.job_name, args=spec.program_args,
            config=spec.config, parallelism=spec.parallelism, checkpoint_dir=spec.checkpoint_dir,
            catalog_url=spec.config.get("catalog_url") or spec.catalog_url, redis_url=spec.redis_url,
            attempt=spec.attempt, lineage_id=self.lineage["id"],
        )
        announce_phase(f"building the pipeline (in {spec.entry}(ctx))")
        handle = entry(ctx)
        if not isinstance(handle, SinkHandle):
            raise TypeError(f"{spec.entry}(ctx) must return a sink handle from ctx.sinks.*, got {type(handle).__name__}")
        self.ctx = ctx
        return handle

    def _run_batch(self, handle) -> int:
        threading.Thread(target=self._decline_snapshots_forever, name="no-snapshots", daemon=True).start()
        with self._lock:
            self._batch_running = True
        if self.cancel_requested.is_set():  # came before the cancel thread could see the job
            self.events.emit(Canceled())
            return 0
        self.events.emit(Running(streaming=False, spark_ui=self.spark_ui))
        handle.run()
        if self.fatal is not None:
            raise self.fatal
        if self.cancel_requested.is_set():
            self.events.emit(Canceled())
            return 0
        self.events.emit(Finished())
        return 0

    @staticmethod
    def _sql_conf_keys(config: dict) -> dict[str, str]:
        return {k: str(v) for k, v in (config or {}).items() if isinstance(k, str) and k.startswith("spark.sql.")}

    def _apply_sql_conf(self, config: dict) -> None:
        """`spark.sql.*` options of the job's configuration apply to its (warm, shared-nothing)
        session; a restored query keeps what its checkpoint pinned (e.g. shuffle partitions)."""
        for key, value in self._sql_conf_keys(config).items():
            self.spark.conf.set(key, value)

    def _prepare_streaming(self, spec: TaskSpec, handle, live: Path) -> int:
        """Restore the snapshot (if any) into this attempt's fresh live directory and fence the
        sinks; returns the Spark batch id the attempt resumes after (-1: a fresh start)."""
        restored_batch = -1
        meta = self.restored_meta
        if meta is not None and int(meta.get("spark", {}).get("batch_id", -1)) >= 0:
            from .plan_signature import check_before_start

            announce_phase(f"restoring the snapshot {spec.restore_from}")
            explicit = self._sql_conf_keys(spec.config).get("spark.sql.shuffle.partitions")
            drop = check_before_start(handle.df, meta, shuffle_partitions=int(explicit) if explicit else None,
                                      allow_non_restored_state=spec.allow_non_restored_state,
                                      output_mode=handle.output_mode)
            with restore_failure.restoring(spec.restore_from):
                restore_failure.verify(spec.restore_from, meta)
                storage.restore(spec.restore_from, live, drop_operators=drop)
            restored_batch = int(meta["spark"]["batch_id"])
            print(f"restored {spec.restore_from} (batch {restored_batch}) into {live}", flush=True)
        prepare = getattr(handle, "prepare", None)
        if prepare is not None:
            from .connectors import SinkOwner

            # The owner lets each sink refuse a target another lineage owns (connectors/ownership.py).
            prepare(self.lineage["fence"], restored_batch, owner=SinkOwner(
                lineage=self.lineage["id"], job_id=spec.job_id, generation=self.lineage["generation"]))
        return restored_batch

    def _run_streaming(self, spec: TaskSpec, handle) -> int:
        live = Path(spec.checkpoint_dir) / handle.name
        announce_phase("fencing the sinks")
        self._prepare_streaming(spec, handle, live)
        # Read at the first snapshot, not here: the analysis took 0.12-0.17 s on the path to the
        # task's first result (docs/benchmarks.md, "Submission to first result").
        self._plan_of = (handle.df, handle.output_mode)
        announce_phase("starting the Spark query")
        with self._lock:
            query = handle.start(str(live), query_name=spec.job_id)
            self._query = query
        if self.cancel_requested.is_set():  # cancel came while starting: stop it ourselves
            query.stop()
        self.events.emit(Running(streaming=True, spark_ui=self.spark_ui))
        announce_phase("running")
        last = -1
        finished = False
        pending: list[tuple[TakeSnapshot, int | None, float]] = []
        # A new JobManager leader sends the triggers it inherited again (it cannot know whether
        # they went out): each checkpoint id is served once.
        requested: set[int] = set()
        while True:
            terminated = query.awaitTermination(POLL_S)  # raises if the query failed
            progress = query.lastProgress
            last = self._emit_progress(query, progress, last)
            if terminated:
                break
            if self.cancel_requested.is_set():
                continue  # the cancel thread is stopping the query
            while not self.snapshot_requests.empty():
                req = self.snapshot_requests.get_nowait()
                if req.checkpoint_id in requested:
                    continue
                requested.add(req.checkpoint_id)
                pending.append((req, storage.latest_planned_batch(live), time.monotonic()))
            if pending:
                query, stopped = self._serve_snapshots(spec, handle, query, live, pending)
                if stopped:
                    finished = True
                    break
            if progress is not None and self.ctx.bounded.all_exhausted(
                [s["endOffset"] for s in progress["sources"]]
            ):
                # Let Spark run the no-data batch that advances the watermark, so windows
                # closed by the end of input are emitted before we stop.
                query.processAllAvailable()
                last = self._emit_progress(query, query.lastProgress, last)
                finished = True
                query.stop()
                break
        if self.fatal is not None:
            raise self.fatal
        if self.cancel_requested.is_set() and not finished:
            self.events.emit(Canceled())
            return 0
        exc = query.exception()
        if exc is not None:
            raise exc
        self.events.emit(Finished())
        return 0

    def _serve_snapshots(self, spec: TaskSpec, handle, query, live: Path, pending: list) -> tuple[Any, bool]:
        """Take every requested snapshot whose barrier batch has committed. Returns the query
        (restarted if a stop-with-savepoint failed after stopping it) and whether the task
        stopped for good."""
        for item in list(pending):
            req, planned, received = item
            if req.stop_after:
                pending.remove(item)
                with self._lock:
                    query.stop()
                if req.drain:
                    try:
                        self._drain(spec, handle, live)
                    except Exception as exc:  # noqa: BLE001 - reported; the query resumes below
                        self.events.emit(SnapshotDeclined(checkpoint_id=req.checkpoint_id,
                                                          reason=f"drain failed: {type(exc).__name__}: {exc}"))
                        with self._lock:
                            query = handle.start(str(live), query_name=spec.job_id)
                            self._query = query
                        continue
                if self._snapshot(spec, req, live, storage.latest_committed_batch(live), received, handle):
                    return query, True
                # As in Flink, a failed stop-with-savepoint leaves the job running: resume the
                # query from its own live checkpoint, which nobody else has touched.
                with self._lock:
                    query = handle.start(str(live), query_name=spec.job_id)
                    self._query = query
                continue
            committed = storage.latest_committed_batch(live)
            if planned is None or (committed is not None and committed >= planned):
                pending.remove(item)
                self._snapshot(spec, req, live, committed if planned is not None else None, received, handle)
        return query, False

    def _drain(self, spec: TaskSpec, handle, live: Path) -> None:
        """Before a drained stop (the query is stopped): process everything the sources hold now,
        then run one logged no-data batch whose watermark is the end of event time, so every
        window still open fires into the sink, as Flink's drain does with MAX_WATERMARK. A job
        resumed from such a savepoint treats all new events as late: drain is for the end of a
        pipeline's life, not for upgrades."""
        for end_event_time in (False, True):
            if end_event_time:
                if storage.latest_committed_batch(live) is None:
                    return  # nothing ever ran: no window is open
                storage.log_final_watermark_batch(live)
            with self._lock:
                q = handle.start(str(live), query_name=spec.job_id, available_now=True)
                self._query = q
            if not q.awaitTermination(DRAIN_TIMEOUT_S):
                q.stop()
                raise TimeoutError(f"draining did not finish within {DRAIN_TIMEOUT_S:.0f} s")
            if q.exception() is not None:
                raise q.exception()

    def _plan_signature(self) -> dict | None:
        """The streaming query's plan signature (plan_signature.py), worked out once."""
        if self._plan_of is not None:
            df, output_mode = self._plan_of
            self._plan_of = None
            try:
                self._plan = _plan_of(df, output_mode)
            except Exception as exc:  # noqa: BLE001 - the signature only enriches snapshot metadata
                print(f"plan signature unavailable: {exc!r}", file=sys.stderr, flush=True)
        return self._plan

    def _snapshot(self, spec: TaskSpec, req: TakeSnapshot, live: Path, batch: int | None, received: float,
                  handle) -> bool:
        meta = snapshot_metadata(spec, kind=req.kind, checkpoint_id=req.checkpoint_id)
        meta["pipeline"]["plan"] = self._plan_signature()
        meta["query_name"] = handle.name
        meta["lineage"] = {"id": self.lineage["id"], "generation": self.lineage["generation"]}
        try:
            if batch is None:  # no batch ever planned: the state is the empty start
                info = storage.take_empty_snapshot(Path(req.target), metadata=meta)
            else:
                info = storage.take_snapshot(live, Path(req.target), batch_id=batch, metadata=meta)
        except Exception as exc:  # noqa: BLE001 - every failure is a decline with its reason
            self.events.emit(SnapshotDeclined(checkpoint_id=req.checkpoint_id, reason=f"{type(exc).__name__}: {exc}"))
            return False
        self.events.emit(SnapshotTaken(
            checkpoint_id=req.checkpoint_id, path=str(info.path), batch_id=info.batch_id, state_size=info.state_size,
            duration_ms=int((time.monotonic() - received) * 1000), source_offsets=tuple(info.source_offsets)))
        return True

    def _emit_progress(self, query, latest, last: int) -> int:
        """Emit a Progress per batch committed since batch `last`; returns the newest id."""
        if latest is None or latest.batchId <= last:
            return last
        # recentProgress parses up to 100 JSON reports: only worth it when batches were missed.
        batches = [latest] if latest.batchId == last + 1 else query.recentProgress
        for p in batches:
            if p.batchId > last:
                if last < 0:
                    announce_phase(f"first batch {p.batchId} committed: {json.dumps(p.durationMs)}")
                    self.on_first_batch()
                last = p.batchId
                self.events.emit(Progress(
                    batch_id=p.batchId,
                    num_input_rows=int(p.numInputRows or 0),
                    input_rows_per_second=_finite(p.inputRowsPerSecond),
                    processed_rows_per_second=_finite(p.processedRowsPerSecond),
                    batch_duration_ms=int(p.batchDuration) if p.batchDuration is not None else None,
                    source_lag=_source_lag(p),
                    spark_ui=self.spark_ui,
                ))
        return last


    def _decline_snapshots_forever(self) -> None:
        while True:
            req = self.snapshot_requests.get()
            self.events.emit(SnapshotDeclined(checkpoint_id=req.checkpoint_id, permanent=True,
                                              reason="a batch task has no checkpoints"))


def _ui_url(spark) -> str | None:
    try:
        return spark.sparkContext.uiWebUrl or None
    except Exception:  # noqa: BLE001 - a link for the dashboard, never worth failing a task
        return None


def _source_lag(progress) -> float | None:
    """The largest backlog any source of the batch reports, or None: Kafka's metric
    maxOffsetsBehindLatest, or the entries a Redis stream source counted beyond its batch (in the
    latest offset it reports, see connectors/redis_streams.py)."""
    lags = []
    for source in getattr(progress, "sources", None) or ():
        metrics = getattr(source, "metrics", None) or {}
        raw = metrics.get("maxOffsetsBehindLatest")
        if raw is None:
            raw = _reported_behind(getattr(source, "latestOffset", None))
        try:
            if raw is not None:
                lags.append(float(raw))
        except (TypeError, ValueError):
            continue
    return max(lags) if lags else None


def _reported_behind(latest: Any) -> Any:
    from .connectors.redis_streams import BEHIND_KEY  # imported with Spark, as build_spark does

    if isinstance(latest, str):
        try:
            latest = json.loads(latest)
        except ValueError:
            return None
    return latest.get(BEHIND_KEY) if isinstance(latest, dict) else None


def lineage_of(spec: TaskSpec, restored: dict | None) -> dict:
    """Which sink writer this attempt is. Sinks are named by lineage (the first job of a chain
    of jobs that resumed from each other's savepoints), so a job resumed from a savepoint takes
    over its predecessor's sinks, rewinds them to the savepoint and fences the predecessor off.
    The fence token is the JobManager's (it grows with every deployed attempt of any job)."""
    lineage = (restored or {}).get("lineage") or {}
    if restored is None or not lineage.get("id"):
        lin_id, generation = spec.job_id, 0
    elif restored.get("job_id") == spec.job_id:
        lin_id, generation = lineage["id"], int(lineage.get("generation", 0))
    else:
        lin_id, generation = lineage["id"], int(lineage.get("generation", 0)) + 1
    return {"id": lin_id, "generation": generation, "fence": spec.fence_token or spec.attempt}


def _plan_of(df, output_mode: str) -> dict | None:
    from .plan_signature import plan_signature

    return plan_signature(df, output_mode=output_mode)


def _finite(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if v == v and v not in (float("inf"), float("-inf")) else 0.0


def format_failure(e: BaseException) -> str:
    """The Python traceback of the failure; for Spark errors also the message Spark carries
    (for a failed streaming query it holds the worker's Python traceback)."""
    text = "".join(traceback.format_exception(e))
    desc = getattr(e, "desc", None) or getattr(e, "_desc", None)
    if desc and str(desc) not in text:
        text += "\n" + str(desc)
    return text


# ---------------------------------------------------------------- entry point

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.taskmanager.runtime.runner")
    p.add_argument("--parallelism", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--events-fd", type=int, required=True)
    p.add_argument("--driver-memory", default="1g")
    p.add_argument("--shuffle-partitions", type=int, default=None,
                   help="default: max(2, parallelism)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up job (measurements)")
    p.add_argument("--spark-ui", action="store_true", help="run the Spark UI (the TaskManager's spark_ui setting)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="the TaskManager's pid: exit once it is no longer the parent (default: the parent at start)")
    p.add_argument("--master", default="local", help="local, or a standalone master URL spark://host:port")
    p.add_argument("--executor-cores", type=int, default=1)
    p.add_argument("--executor-memory", default="1g")
    p.add_argument("--executor-timeout", type=float, default=300.0,
                   help="seconds a task's work may wait for its first executor before it fails")
    p.add_argument("--host", default="127.0.0.1", help="the address executors reach this driver at")
    p.add_argument("--class-archive", type=Path, default=None,
                   help="the driver JVM's class-data-sharing archive, used if it exists (class_archive.py)")
    p.add_argument("--python-forkserver", action="store_true",
                   help="local engine: start Spark's per-query Python source runner from a preloaded fork "
                        "server (python_forkserver.py)")
    return p.parse_args(argv)


def engine_of(args: argparse.Namespace) -> Engine:
    return Engine(master=args.master, executor_cores=args.executor_cores, executor_memory=args.executor_memory,
                  executor_timeout_s=args.executor_timeout, host=args.host)


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    args = parse_args(argv)
    engine = engine_of(args)
    prepare_env(engine.host)
    events = EventWriter(args.events_fd)
    spark_box: list[Any] = [None]
    driver_box: list[Driver | None] = [None]

    def orphaned() -> None:
        print("parent process died: exiting", file=sys.stderr, flush=True)
        stop_spark_quietly(spark_box[0], 3.0)
        end_own_session()
        os._exit(1)

    def on_sigterm(signum, frame) -> None:
        d = driver_box[0]
        if d is not None and d.task_started:
            d.request_cancel()
        else:
            raise _Terminate()

    signal.signal(signal.SIGTERM, on_sigterm)
    # Into the log (stderr): works even while the main thread is stuck in C code.
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    start_watchdog(orphaned, parent=args.parent_pid)
    code = 0
    try:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        shuffle = args.shuffle_partitions or max(2, args.parallelism)
        # A driver that warms up waits in reserve for a task: its JIT's C2 only on idle CPU until then.
        optimizer = None if args.no_warmup else jit_in_reserve.OptimizerInReserve().start()
        spark = build_spark(args.parallelism, workdir, shuffle_partitions=shuffle,
                            driver_memory=args.driver_memory, ui=args.spark_ui or spark_ui_wanted(), engine=engine,
                            extra_java_options=class_archive.java_options(args.class_archive),
                            python_forkserver=args.python_forkserver)
        spark_box[0] = spark
        if not args.no_warmup:
            t_w = time.monotonic()
            warm_up(spark, workdir, args.parallelism)
            print(f"warm-up took {time.monotonic() - t_w:.2f}s", flush=True)
        driver = Driver(events, spark, args.parallelism, engine)
        driver_box[0] = driver
        events.emit(Ready(pid=os.getpid(), parallelism=args.parallelism,
                          startup_s=round(time.monotonic() - t0, 3)))
        line = sys.stdin.readline()
        if optimizer is not None:
            # Not at once: C2's queue, compiled at the normal priority beside the task's first
            # batch, delayed the first result by ~0.5-1 s; it is wanted once data flows.
            driver.on_first_batch = optimizer.release
            optimizer.release_after(jit_in_reserve.TASK_GRACE_S)
        if not line.strip():
            return 0  # stdin closed before any task: the slot is being discarded
        driver.task_started = True
        try:
            cmd = decode_command(line)
        except Exception as e:
            events.emit(Failed(error_name=type(e).__name__, traceback=format_failure(e)))
            code = 1
            return code
        if not isinstance(cmd, RunTask):
            events.emit(Canceled())
            return 0
        driver.listen_for_cancel(sys.stdin)
        code = driver.run(cmd.spec)
        return code
    except _Terminate:
        code = 0
        return code
    except BaseException:
        traceback.print_exc()
        code = 1
        return code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        stop_spark_quietly(spark_box[0], 15.0)
        # Py4J and stdin threads must not keep a finished driver alive.
        os._exit(code)


if __name__ == "__main__":
    main()
