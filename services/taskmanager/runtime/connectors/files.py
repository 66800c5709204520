"""File sink (parquet, csv, json).

Streaming uses Spark's own file sink: its `_spark_metadata` log plus the query checkpoint make
the output exactly-once for readers that go through Spark. Struct columns are flattened first
because csv cannot hold them and flat files are what downstream tools expect.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import DataFrame

from . import SinkHandle, flatten_structs

FORMATS = ("parquet", "csv", "json")


def file_sink(
    df: DataFrame,
    path: str,
    *,
    format: str = "parquet",
    mode: str = "overwrite",
    partition_by: Sequence[str] = (),
    options: dict[str, str] | None = None,
    trigger: str | None = None,
    name: str | None = None,
) -> SinkHandle:
    if format not in FORMATS:
        raise ValueError(f"file sink format must be one of {FORMATS}, not {format!r}")
    opts = dict(options or {})
    if format == "csv":
        opts.setdefault("header", "true")
    flat = flatten_structs(df)

    def configure(writer):
        writer = writer.format(format).option("path", path).options(**opts)
        return writer.partitionBy(*partition_by) if partition_by else writer

    def run_batch() -> None:
        writer = flat.write.format(format).mode(mode).options(**opts)
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.save(path)

    # Spark's file sink only supports append for streaming.
    return SinkHandle(name=name or f"files-{format}", df=flat, output_mode="append", trigger=trigger,
                      configure=configure, run_batch=run_batch)
