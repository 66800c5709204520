"""Connectors of the Headrace data plane: one module per external system.

A source returns a DataFrame; a sink returns a `SinkHandle` that the runner starts (streaming)
or runs (batch). Handles are lazy so that the runner, not the pipeline, owns the query's
lifecycle: checkpoint location, progress polling, finish detection and cancellation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery


@dataclass
class SinkHandle:
    """What `build(ctx)` returns.

    `name` names the checkpoint subdirectory, so it must stay stable across attempts of a job.
    Streaming: `configure(writer)` adds the sink's format/options to a `DataStreamWriter` whose
    output mode, trigger and checkpoint the handle applies. Batch: `run_batch()` does the write.
    """

    name: str
    df: "DataFrame"
    output_mode: str = "append"
    trigger: str | None = None
    configure: Callable[["DataStreamWriter"], "DataStreamWriter"] | None = None
    run_batch: Callable[[], None] | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def streaming(self) -> bool:
        return self.df.isStreaming

    def start(self, checkpoint_location: str, query_name: str | None = None) -> "StreamingQuery":
        if self.configure is None:
            raise TypeError(f"sink {self.name} does not support streaming DataFrames")
        writer = self.df.writeStream.outputMode(self.output_mode)
        writer = writer.option("checkpointLocation", checkpoint_location)
        if query_name:
            writer = writer.queryName(query_name)
        if self.trigger:
            writer = writer.trigger(processingTime=self.trigger)
        return self.configure(writer).start()

    def run(self) -> None:
        if self.run_batch is None:
            raise TypeError(f"sink {self.name} does not support batch DataFrames")
        self.run_batch()


def register_data_sources(spark: "SparkSession") -> None:
    """Register the Python data sources (idempotent; cheap)."""
    from .datagen import DatagenDataSource
    from .redis_streams import RedisStreamDataSource

    spark.dataSource.register(DatagenDataSource)
    spark.dataSource.register(RedisStreamDataSource)


def flatten_structs(df: "DataFrame") -> "DataFrame":
    """Struct columns become `<col>_<field>` columns (a window becomes window_start/window_end):
    tables and files want flat rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    cols = []
    for f in df.schema.fields:
        if isinstance(f.dataType, StructType):
            cols += [F.col(f"`{f.name}`.`{s.name}`").alias(f"{f.name}_{s.name}") for s in f.dataType.fields]
        else:
            cols.append(F.col(f"`{f.name}`"))
    return df.select(*cols)
