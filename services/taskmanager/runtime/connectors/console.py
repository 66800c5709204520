"""Console sink: prints rows to the driver's stdout, i.e. the task's log file."""

from __future__ import annotations

from pyspark.sql import DataFrame

from .sinks import SinkHandle


def console_sink(
    df: DataFrame,
    *,
    output_mode: str = "append",
    num_rows: int = 20,
    truncate: bool = False,
    trigger: str | None = None,
    name: str = "console",
) -> SinkHandle:
    def configure(writer):
        return writer.format("console").option("numRows", num_rows).option("truncate", truncate)

    def run_batch() -> None:
        df.show(num_rows, truncate=truncate)

    return SinkHandle(
        name=name, df=df, output_mode=output_mode, trigger=trigger, configure=configure, run_batch=run_batch
    )
