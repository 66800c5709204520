"""The Driver: runs the one task of a warm driver process, from its RunTask to the event that
ends it (`finished`, `failed` or `canceled`).

Streaming finish rule: a query whose sources are all bounded (registered by ctx.sources.* with a
bound) finishes once the committed end offset of every source reached its bound; the driver
then lets Spark run the pending no-data batch (watermark advance) and stops the query. Queries
with an unbounded source run until canceled. Cancel (a `cancel` line on stdin or SIGTERM) stops
the query; a task that finds no executor (cluster_mode.py) fails with that reason."""

from __future__ import annotations

import queue
import threading
import traceback
from pathlib import Path
from typing import IO, Any

from shared import checkpoint_storage as storage
from shared import job_options, kafka_delivery, restore_failure
from shared.lineage import lineage_of
from shared.task_protocol import (
    Canceled,
    Failed,
    Finished,
    Granted,
    Initializing,
    Running,
    TakeSnapshot,
    TaskSpec,
    Waiting,
    decode_command,
)

from . import grants
from .cluster_mode import Engine, ExecutorWatch, NoExecutors
from .driver_io import EventWriter, PhaseLog
from .pipeline_loader import load_pipeline
from .query_slot import QuerySlot
from .reports import ProgressReporter, format_failure, ui_url
from .restore import prepare_streaming, sql_conf_keys
from .snapshots import SnapshotServer, decline_forever

POLL_S = 0.25


class Driver:
    def __init__(self, events: EventWriter, spark: Any, parallelism: int, engine: Engine = Engine()) -> None:
        self.events = events
        self.spark = spark
        self.parallelism = parallelism
        self.engine = engine
        self.phases = PhaseLog()
        self.fatal: BaseException | None = None  # set by a watch that ends the task (NoExecutors)
        self.task_started = False
        self.cancel_requested = threading.Event()
        self.queries = QuerySlot()
        self.ctx: Any = None  # the PipelineContext of the task, once built
        self.snapshot_requests: queue.Queue[TakeSnapshot] = queue.Queue()
        self.restored_meta: dict | None = None  # metadata of the snapshot this attempt starts from
        self.lineage: dict = {}
        self.spark_ui = ui_url(spark)
        # What the task asks its TaskManager for (a files sink's directory): answers come on stdin.
        self.grants = grants.Grants(events.emit)
        grants.install(self.grants)

    # -- cancellation, from the stdin thread or the SIGTERM handler
    def request_cancel(self) -> None:
        if self.cancel_requested.is_set():
            return
        self.cancel_requested.set()
        threading.Thread(target=self._do_cancel, name="cancel", daemon=True).start()

    def _do_cancel(self) -> None:
        query, batch = self.queries.current()
        try:
            if query is not None:
                query.stop()
            elif batch:
                self.spark.sparkContext.cancelAllJobs()
        except Exception:  # noqa: BLE001 - the task ends canceled all the same
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
                except Exception:  # noqa: BLE001 - a newer TaskManager's command: not ours to act on
                    print(f"ignoring unknown command: {line[:200]}", flush=True)
                    continue
                if cmd.cmd == "cancel":
                    self.request_cancel()
                elif isinstance(cmd, TakeSnapshot):
                    self.snapshot_requests.put(cmd)
                elif isinstance(cmd, Granted):
                    self.grants.answer(cmd)

        threading.Thread(target=loop, name="stdin", daemon=True).start()

    def _starved(self, exc: NoExecutors) -> None:
        """No executor came: end the task as failed (not canceled) with that reason."""
        self.fatal = exc
        print(f"failing the task: {exc}", flush=True)
        query, _ = self.queries.current()
        try:
            if query is not None:
                query.stop()
            self.spark.sparkContext.cancelAllJobs()
        except Exception:  # noqa: BLE001
            traceback.print_exc()

    # -- running
    def run(self, spec: TaskSpec) -> int:
        self.phases.task_arrived()
        self.task_started = True
        self.events.emit(Initializing())
        watch = ExecutorWatch(self.spark, self.engine, self.parallelism, self._starved).start()
        try:
            code = self._run(spec)
            if self.fatal is not None:
                raise self.fatal
            return code
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, then we exit
            failure = self.fatal if self.fatal is not None else exc
            if self.fatal is None and self.cancel_requested.is_set():
                self.events.emit(Canceled())
                return 0
            text = format_failure(failure)
            # Records Kafka no longer has are lost to every restart alike: named so, the job fails.
            name = (
                "KafkaDataLoss"
                if text.rstrip().splitlines()[-1].startswith("KafkaDataLoss:")
                else type(failure).__name__
            )
            self.events.emit(Failed(error_name=name, traceback=text))
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

    def _build(self, spec: TaskSpec) -> Any:
        from .connectors import SinkHandle
        from .context import PipelineContext

        if not spec.artifact_path:
            raise ValueError("task has no artifact_path")
        self.phases.announce(f"importing the pipeline module {Path(spec.artifact_path).name}")
        module = load_pipeline(spec.artifact_path, spec.config, self.spark)
        entry = getattr(module, spec.entry, None)
        if not callable(entry):
            raise AttributeError(f"pipeline {spec.artifact_path} has no function {spec.entry}(ctx)")
        ctx = PipelineContext(
            self.spark,
            job_id=spec.job_id,
            job_name=spec.job_name,
            args=spec.program_args,
            config=spec.config,
            parallelism=spec.parallelism,
            checkpoint_dir=spec.checkpoint_dir,
            catalog_url=spec.config.get("catalog_url") or spec.catalog_url,
            redis_url=spec.redis_url,
            kafka_bootstrap_servers=spec.config.get("kafka_bootstrap_servers") or spec.kafka_bootstrap_servers,
            lake_dir=spec.lake_dir,
            storage_roots=spec.storage_roots,
            attempt=spec.attempt,
            lineage_id=self.lineage["id"],
            report_waiting=lambda reason: self.events.emit(Waiting(reason=reason)),
        )
        self.phases.announce(f"building the pipeline (in {spec.entry}(ctx))")
        handle = entry(ctx)
        if not isinstance(handle, SinkHandle):
            raise TypeError(
                f"{spec.entry}(ctx) must return a sink handle from ctx.sinks.*, got {type(handle).__name__}"
            )
        self.ctx = ctx
        return handle

    def _run_batch(self, handle: Any) -> int:
        threading.Thread(
            target=decline_forever, args=(self.events, self.snapshot_requests), name="no-snapshots", daemon=True
        ).start()
        self.queries.batch_started()
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

    def _apply_sql_conf(self, config: dict) -> None:
        """`spark.sql.*` options of the job's configuration apply to its (warm, shared-nothing)
        session; a restored query keeps what its checkpoint pinned (e.g. shuffle partitions)."""
        for key, value in sql_conf_keys(config).items():
            self.spark.conf.set(key, value)

    def _run_streaming(self, spec: TaskSpec, handle: Any) -> int:
        try:
            return self._stream(spec, handle)
        finally:
            if handle.two_phase is not None:
                # Committed by now unless the task failed or was canceled: then what its open
                # transaction holds is dropped at once (the next attempt re-runs it), instead of
                # holding read_committed consumers up until the transaction's timeout.
                handle.two_phase.close(abort=True)

    def _stream(self, spec: TaskSpec, handle: Any) -> int:
        live = Path(spec.checkpoint_dir) / handle.name
        real_time = kafka_delivery.real_time_trigger(spec.config)
        if real_time is not None:
            if not handle.supports_real_time:
                raise kafka_delivery.DeliveryError(
                    f"{kafka_delivery.REAL_TIME_OPTION} runs Spark's real-time mode, which only Spark's own Kafka "
                    "sink takes (ctx.sinks.kafka(..., delivery='at-least-once')) behind a Kafka source and "
                    "stateless operators: drop the option, or use that sink"
                )
            self.phases.announce(f"real-time mode: batches of {real_time}")
            handle.real_time = real_time
        if job_options.latency_mode(spec.config) and handle.trigger:
            # The latency mode starts each micro-batch as soon as the one before it commits.
            self.phases.announce(f"latency mode: the pipeline's trigger ({handle.trigger}) is not used")
            handle.trigger = None
        self.phases.announce("fencing the sinks")
        prepare_streaming(spec, handle, live, self.restored_meta, self.lineage, self.phases)
        snapshots = SnapshotServer(self.events, self.queries, spec, handle, live, self.lineage)
        progress = ProgressReporter(self.events, self.phases, self.spark_ui, sink_figures=handle.commit_figures)
        self.phases.announce("starting the Spark query")
        query = self.queries.start(handle, live, spec.job_id)
        if self.cancel_requested.is_set():  # cancel came while starting: stop it ourselves
            query.stop()
        self.events.emit(Running(streaming=True, spark_ui=self.spark_ui))
        self.phases.announce("running")
        finished = False
        while True:
            terminated = query.awaitTermination(POLL_S)  # raises if the query failed
            latest = query.lastProgress
            progress.report(query, latest)
            if terminated:
                break
            if self.cancel_requested.is_set():
                continue  # the cancel thread is stopping the query
            snapshots.take_requests(self.snapshot_requests)
            if snapshots.pending:
                query, stopped = snapshots.serve(query)
                if stopped:
                    finished = True
                    break
            if latest is not None and self.ctx.bounded.all_exhausted([s["endOffset"] for s in latest["sources"]]):
                # Let Spark run the no-data batch that advances the watermark, so windows
                # closed by the end of input are emitted before we stop.
                query.processAllAvailable()
                progress.report(query, query.lastProgress)
                finished = True
                query.stop()
                snapshots.commit_final()
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
