"""Connectors of the Headrace data plane: one module per external system.

A source returns a DataFrame; a sink returns a `SinkHandle` that the runner starts (streaming)
or runs (batch). Handles are lazy so that the runner, not the pipeline, owns the query's
lifecycle: checkpoint location, progress polling, finish detection and cancellation.

Attempt fencing (streaming): every task attempt runs on its own Spark checkpoint, restored from
a snapshot at Spark batch r (-1: fresh start). Before the query starts, the runner calls
`handle.prepare(attempt, r)`. The sink then (1) takes over the sink for this attempt, refusing
if a newer attempt already holds it, (2) undoes what the discarded lineage committed after r
(the new attempt re-runs batches r+1, r+2, ... with possibly different contents), and (3) from
then on checks, atomically with each batch's commit, that this attempt still holds the sink,
raising `SinkFencedError` otherwise. So a frozen attempt that wakes up after being replaced (a
zombie) can never write again, whatever batch id it is at. Without `prepare` (batch jobs, tools)
a sink neither fences nor undoes: it is idempotent per batch id, as before.

Ownership (ownership.py): the fence token orders attempts within one lineage only, so `prepare`
also gets the attempt's `SinkOwner` (lineage, job). Each target records the lineage that owns
it, and a prepare by another lineage raises `SinkOwnedError` before anything is written or
deleted: a fresh job can neither undo another job's committed output nor start a fencing
tug-of-war with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ownership import SinkOwnedError, SinkOwner
from .sinks import SinkFencedError, SinkHandle, flatten_structs

__all__ = ["SinkFencedError", "SinkHandle", "SinkOwnedError", "SinkOwner", "flatten_structs", "register_data_sources"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register_data_sources(spark: "SparkSession") -> None:
    """Register the Python data sources (idempotent; cheap)."""
    from .datagen import DatagenDataSource
    from .redis_streams import RedisStreamDataSource

    spark.dataSource.register(DatagenDataSource)
    spark.dataSource.register(RedisStreamDataSource)
