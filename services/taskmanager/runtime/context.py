"""`PipelineContext`: what a pipeline's `build(ctx)` gets, and what it may use.

    def build(ctx):
        clicks = ctx.sources.datagen(seed=1, total=3000, rows_per_second=300)
        counts = clicks.withWatermark("event_time", "10 seconds") \
                       .groupBy(F.window("event_time", "1 minute"), "url").count()
        return ctx.sinks.sql_table(counts, "clicks_per_minute",
                                   key_columns=["window_start", "window_end", "url"])

Sources return DataFrames; sinks return a `SinkHandle` that the runner starts. Connection
settings default to the task's own (`redis_url`, `catalog_url`, `kafka_bootstrap_servers`) and
can be overridden per call; Delta tables live in the task's lake directory (`lake_dir`).
`kafka_bootstrap_servers` is the job option of that name, else the
cluster's `pipeline_kafka_bootstrap_servers` (`headrace up --kafka` sets it), else "".
`catalog_url` is the pipeline's own database (the job option `catalog_url`, else the cluster's
`pipeline_catalog_url`, else its lineage's own SQLite file when the cluster keeps one per lineage,
as `headrace up` does), never the control plane's catalog; without one, a SQL source or sink must
be given `url=`.
Bounded streaming sources register themselves so the runner knows when a query is done.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from shared import job_options, kafka_delivery, redis_key_grants

from .connectors import (
    SinkHandle,
    delta_maintenance,
    delta_paths,
    delta_sink,
    delta_source,
    kafka_sink,
    kafka_source,
    redis_key_access,
    sql_retry,
    sql_source,
)
from .connectors import console as console_conn
from .connectors import datagen as datagen_conn
from .connectors import files as files_conn
from .connectors import redis_streams as redis_conn
from .connectors import sql as sql_conn
from .connectors.delta_errors import DeltaPathRefused


@dataclass(frozen=True)
class BoundedSource:
    """A streaming source that ends: `exhausted(end_offset)` says whether a committed end offset
    covers all of its input."""

    name: str
    exhausted: Callable[[dict | None], bool]


class BoundedRegistry:
    def __init__(self) -> None:
        self.sources: list[BoundedSource] = []

    def add(self, source: BoundedSource) -> None:
        self.sources.append(source)

    def all_exhausted(self, end_offsets: Sequence[Any]) -> bool:
        """True when every source of a query (given by its committed end offsets, in progress
        order) is a bounded source that is exhausted.

        Spark's progress does not name Python sources, so sources are matched to registrations
        by trying assignments: a query with any unbounded source never finishes.
        """
        offsets = [json.loads(o) if isinstance(o, str) else o for o in end_offsets]
        if not offsets or len(offsets) > len(self.sources):
            return False
        for chosen in itertools.permutations(self.sources, len(offsets)):
            if all(src.exhausted(off) for src, off in zip(chosen, offsets, strict=True)):
                return True
        return False


class Sources:
    def __init__(self, ctx: "PipelineContext"):
        self._ctx = ctx

    def datagen(
        self,
        *,
        seed: int = 0,
        total: int | None = None,
        rows_per_second: float | None = None,
        events_per_minute: int = datagen_conn.DEFAULT_EVENTS_PER_MINUTE,
        num_users: int = datagen_conn.DEFAULT_NUM_USERS,
        max_delay_ms: int = datagen_conn.DEFAULT_MAX_DELAY_MS,
        urls: Sequence[str] | None = None,
        base_time: datetime | None = None,
        max_rows_per_batch: int | None = None,
        partitions: int | None = None,
        streaming: bool = True,
    ) -> DataFrame:
        """Click events `i, user_id, url, event_time` (see connectors.datagen.generate_event).

        Bounded when `total` is set: the runner then finishes the query once all `total` events
        are committed. Unbounded streams need `rows_per_second`.
        """
        opts: dict[str, str] = {
            "seed": str(seed),
            "events_per_minute": str(events_per_minute),
            "num_users": str(num_users),
            "max_delay_ms": str(max_delay_ms),
            "partitions": str(partitions or self._ctx.parallelism),
        }
        if total is not None:
            opts["total"] = str(total)
        if rows_per_second:
            opts["rows_per_second"] = str(rows_per_second)
        if max_rows_per_batch:
            opts["max_rows_per_batch"] = str(max_rows_per_batch)
        if urls:
            opts["urls"] = ",".join(urls)
        if base_time is not None:
            opts["base_time"] = base_time.isoformat()
        spark = self._ctx.spark
        if not streaming:
            return spark.read.format("datagen").options(**opts).load()
        if total is not None:
            self._ctx.bounded.add(
                BoundedSource(
                    f"datagen(seed={seed}, total={total})", functools.partial(datagen_conn.is_exhausted, total=total)
                )
            )
        return spark.readStream.format("datagen").options(**opts).load()

    def redis_stream(
        self,
        stream: str,
        *,
        schema: str,
        url: str | None = None,
        start: str = "0",
        max_entries_per_trigger: int | None = None,
        partitions: int | None = None,
    ) -> DataFrame:
        """Unbounded stream of events with the given DDL schema (packed Arrow or JSON entries).
        `start`: "0" the whole stream, "$" only entries added after the query first starts, or
        an entry id (exclusive)."""
        opts = {
            "url": self._ctx.redis_for(url, read=stream),
            "stream": stream,
            "start": start,
            "partitions": str(partitions or self._ctx.parallelism),
        }
        if max_entries_per_trigger:
            opts["max_entries_per_trigger"] = str(max_entries_per_trigger)
        return self._ctx.spark.readStream.format("redis_stream").schema(schema).options(**opts).load()

    def kafka(
        self,
        topics: str | Sequence[str] | None = None,
        *,
        bootstrap_servers: str | None = None,
        starting_offsets: str | Mapping[str, Any] = "earliest",
        options: Mapping[str, Any] | None = None,
        pattern: str | None = None,
    ) -> DataFrame:
        """Spark's own Kafka source (key, value, topic, partition, offset, timestamp, ...), its
        offsets in every checkpoint and savepoint. `topics`: a name or a list, or `pattern=` a
        subscription pattern. `starting_offsets` (a fresh start only): "earliest", "latest" or
        {"topic": {"partition": offset}}. `options`: Spark's Kafka options, `kafka.*` for the
        client (see connectors/kafka_source.py). `bootstrap_servers` defaults to the cluster's
        broker (`headrace up --kafka`)."""
        return kafka_source.kafka_source(
            self._ctx.spark,
            topics,
            pattern=pattern,
            bootstrap_servers=self._ctx.kafka_address(bootstrap_servers),
            starting_offsets=starting_offsets,
            options=options,
            on_wait=None if self._ctx.planning else self._ctx.report_waiting,
            check=not self._ctx.planning,
        )

    def sql_table(self, table: str, *, url: str | None = None, columns: Sequence[str] | None = None) -> DataFrame:
        """A bounded (batch) DataFrame of a whole table, read on the driver."""
        return sql_source.sql_source(self._ctx.spark, self._ctx.database_url(url, "sources"), table, columns=columns)

    def delta(
        self, path: str, *, starting_version: int | str | None = None, options: Mapping[str, Any] | None = None
    ) -> DataFrame:
        """A streaming read of the Delta table at `path` (relative: in the lake directory), its
        offsets in every checkpoint and savepoint; `starting_version` for a fresh start, `options`
        Delta's own (maxFilesPerTrigger, skipChangeCommits, ...). See connectors/delta_source.py."""
        return delta_source.delta_stream(
            self._ctx.spark, self._ctx.table_path(path), starting_version=starting_version, options=options
        )

    def delta_table(self, path: str, *, version: int | None = None) -> DataFrame:
        """A bounded read of the Delta table at `path` (at `version`, time travel, if given)."""
        return delta_source.delta_table(self._ctx.spark, self._ctx.table_path(path), version=version)


class Sinks:
    def __init__(self, ctx: "PipelineContext"):
        self._ctx = ctx

    def sql_table(
        self,
        df: DataFrame,
        table: str,
        *,
        key_columns: Sequence[str] = (),
        url: str | None = None,
        output_mode: str = "update",
        overwrite: bool = False,
        trigger: str | None = None,
        max_retry_time: str | float | None = None,
        max_retries: int | None = None,
    ) -> SinkHandle:
        """Exactly-once table sink: upsert by `key_columns` (plain insert without them), one
        transaction per micro-batch with a commit marker. `overwrite` (batch only) empties the
        table in the same transaction. Struct columns are flattened (window_start, window_end).
        A batch waits for an unreachable database up to `max_retry_time` (default: the job option
        sink.max-retry-time, else 60 s) and `max_retries` retries (sink.max-retries, else no
        count limit) before the task fails (connectors/sql_retry.py)."""
        retry = sql_retry.RetryPolicy.from_options(
            self._ctx.config, max_retry_time=max_retry_time, max_retries=max_retries
        )
        return sql_conn.sql_sink(
            df,
            self._ctx.database_url(url, "sinks"),
            table,
            sink_id=f"{self._ctx.lineage_id}:{table}",
            key_columns=key_columns,
            output_mode=output_mode,
            overwrite=overwrite,
            trigger=trigger,
            retry=retry,
            on_wait=self._ctx.report_waiting,
        )

    def redis_stream(
        self,
        df: DataFrame,
        stream: str,
        *,
        url: str | None = None,
        rows_per_entry: int = 1000,
        maxlen: int | None = None,
        output_mode: str = "append",
        trigger: str | None = None,
    ) -> SinkHandle:
        """Packed Arrow entries (`arrow` field), exactly once per micro-batch id; a restarted
        attempt deletes the entries of the batches it re-runs (see connectors.redis_streams)."""
        return redis_conn.redis_stream_sink(
            df,
            self._ctx.redis_for(url, write=stream),
            stream,
            sink_id=f"{self._ctx.lineage_id}:{stream}",
            rows_per_entry=rows_per_entry,
            maxlen=maxlen,
            output_mode=output_mode,
            trigger=trigger,
        )

    def files(
        self,
        df: DataFrame,
        path: str,
        *,
        format: str = "parquet",
        mode: str = "overwrite",
        partition_by: Sequence[str] = (),
        options: dict[str, str] | None = None,
        trigger: str | None = None,
    ) -> SinkHandle:
        """Parquet/CSV/JSON files under `path` (`mode` applies to batch writes; streaming
        appends exactly once per micro-batch, see connectors.files)."""
        return files_conn.file_sink(
            df, path, format=format, mode=mode, partition_by=partition_by, options=options, trigger=trigger
        )

    def kafka(
        self,
        df: DataFrame,
        topic: str,
        *,
        bootstrap_servers: str | None = None,
        delivery: str = kafka_delivery.EXACTLY_ONCE,
        options: Mapping[str, Any] | None = None,
        trigger: str | None = None,
        transactional_id_prefix: str = "headrace-",
    ) -> SinkHandle:
        """Records from `df`'s `value` (and `key`, `headers`, `partition`) columns into `topic`.
        delivery="exactly-once": in Kafka transactions committed at checkpoints, each record seen
        once by read_committed consumers (visible one checkpoint interval later); "at-least-once":
        Spark's own sink. See connectors/kafka_sink.py."""
        config = self._ctx.config
        timeout_s = (
            job_options.duration_s(config[kafka_delivery.TRANSACTION_TIMEOUT_OPTION], positive=True)
            if kafka_delivery.TRANSACTION_TIMEOUT_OPTION in config
            else kafka_delivery.default_timeout_s(self._ctx.checkpoint_interval_s)
        )
        return kafka_sink.kafka_sink(
            df,
            topic,
            bootstrap_servers=self._ctx.kafka_address(bootstrap_servers),
            delivery=delivery,
            sink_id=f"{self._ctx.lineage_id}:{topic}",
            lineage=self._ctx.lineage_id,
            job_id=self._ctx.job_id,
            options=options,
            trigger=trigger,
            transaction_timeout_s=timeout_s,
            interval_s=self._ctx.checkpoint_interval_s,
            transactional_id_prefix=transactional_id_prefix,
            on_wait=self._ctx.report_waiting,
            check=not self._ctx.planning,
        )

    def delta(
        self,
        df: DataFrame,
        path: str,
        *,
        key_columns: Sequence[str] = (),
        output_mode: str = "append",
        partition_by: Sequence[str] = (),
        options: Mapping[str, Any] | None = None,
        trigger: str | None = None,
        shared_append: bool = False,
    ) -> SinkHandle:
        """Exactly-once Delta Lake table at `path` (relative: in the lake directory). "append" adds
        each row once, "update" MERGEs each micro-batch by `key_columns`, "complete" replaces the
        table per batch. `options`: Delta's writer options (mergeSchema, ...) and the table's
        upkeep (optimize.every, vacuum.every, vacuum.retention, ...; job options sink.delta.*).
        `shared_append`: other lineages may append too. See connectors/delta_sink.py."""
        opts = {str(k): v for k, v in (options or {}).items()}
        return delta_sink.delta_sink(
            df,
            self._ctx.table_path(path),
            lineage=self._ctx.lineage_id,
            output_mode=output_mode,
            key_columns=key_columns,
            partition_by=partition_by,
            options=opts,
            trigger=trigger,
            shared_append=shared_append,
            policy=delta_maintenance.Policy.read(opts, self._ctx.config),
            on_wait=self._ctx.report_waiting,
        )

    def console(
        self,
        df: DataFrame,
        *,
        output_mode: str = "append",
        num_rows: int = 20,
        truncate: bool = False,
        trigger: str | None = None,
    ) -> SinkHandle:
        return console_conn.console_sink(
            df, output_mode=output_mode, num_rows=num_rows, truncate=truncate, trigger=trigger
        )


class PipelineContext:
    def __init__(
        self,
        spark: SparkSession,
        *,
        job_id: str,
        job_name: str = "",
        args: Sequence[str] = (),
        config: dict[str, Any] | None = None,
        parallelism: int = 1,
        checkpoint_dir: str = "",
        catalog_url: str = "",
        redis_url: str = "",
        kafka_bootstrap_servers: str = "",
        lake_dir: str = "",
        storage_roots: Sequence[str] = (),
        attempt: int = 0,
        lineage_id: str | None = None,
        report_waiting: Callable[[str | None], None] | None = None,
        planning: bool = False,
    ):
        self.spark = spark
        self.job_id = job_id
        self.job_name = job_name
        self.args: list[str] = list(args)
        self.config: dict[str, Any] = dict(config or {})
        self.parallelism = parallelism
        self.checkpoint_dir = checkpoint_dir
        self.catalog_url = catalog_url
        self.redis_url = redis_url
        self.kafka_bootstrap_servers = kafka_bootstrap_servers  # host:port[,host:port], "" for none
        # Where Delta tables may lie: relative paths land in the lake directory (connectors/delta_paths.py).
        self.lake_dir, self.storage_roots = lake_dir, tuple(storage_roots)
        # Informational (e.g. for logs): sinks learn their attempt from SinkHandle.prepare.
        self.attempt = attempt
        # Sinks are named by lineage: a job resumed from another job's savepoint takes over
        # (rewinds and fences) the sinks of the job it continues. Default: this job.
        self.lineage_id = lineage_id or job_id
        # What a sink waiting for an outside system tells the task's status (driver.py).
        self.report_waiting = report_waiting
        # Built by the restore check's planner: connectors reach no outside system.
        self.planning = planning
        self.bounded = BoundedRegistry()
        self.sources = Sources(self)
        self.sinks = Sinks(self)

    @property
    def checkpoint_interval_s(self) -> float | None:
        """The checkpoint interval the job's own configuration sets (None: the cluster's default)."""
        from shared import checkpointing

        try:
            return checkpointing.checkpoint_config(self.config).interval_s
        except checkpointing.InvalidCheckpointConfig:
            return None

    def kafka_address(self, bootstrap_servers: str | None) -> str:
        """`bootstrap_servers`, else the cluster's broker; a clear error when there is neither."""
        address = bootstrap_servers or self.kafka_bootstrap_servers
        if not address:
            raise ValueError(
                "a Kafka source or sink needs bootstrap_servers='host:port' (this cluster has no "
                "broker of its own: `headrace up --kafka` starts one and makes it the default)"
            )
        return address

    def table_path(self, path: str) -> str:
        """A Delta table's absolute path, inside the lake directory or an allowed storage root. The
        restore check's planner writes nothing: there an unconfined path is only normalised."""
        try:
            return delta_paths.resolve_table_path(path, lake_dir=self.lake_dir, roots=self.storage_roots)
        except DeltaPathRefused:
            if not self.planning:
                raise
            return path

    def redis_for(self, url: str | None, *, read: str = "", write: str = "") -> str:
        """`url`, else the task's own Redis once its user reaches the stream (claimed for the
        lineage where its job declares no keys: connectors/redis_key_access.py)."""
        if url or self.planning or not self.redis_url:
            return url or self.redis_url
        redis_key_access.ensure(
            self.redis_url,
            read=(read,) if read else (),
            write=(write,) if write else (),
            declared=redis_key_grants.declared(self.config),
        )
        return self.redis_url

    def database_url(self, url: str | None, kind: str = "sinks") -> str:
        """`url`, else the task's own database; a clear error when there is neither."""
        if url or self.catalog_url:
            return url or self.catalog_url
        raise ValueError(
            f"ctx.{kind}.sql_table(...) has no database: pass url=..., or set the job option catalog_url, or "
            "the cluster setting pipeline_catalog_url (HEADRACE_PIPELINE_CATALOG_URL). Pipelines are not given "
            "the control plane's catalog"
        )
