"""Bounded batch job: SQL table -> per-URL daily statistics -> Parquet.

Reads the click table (`--table`, default `clicks`) from `--source-url` (default the pipeline
database, `ctx.catalog_url`: SQLite or PostgreSQL), computes per (day, url) the number of clicks, distinct
users and first/last click time, and writes Parquet files to `--output`.

If the input table does not exist it is first created and filled with `--seed-events`
deterministic events from the data generator (seed `--seed`), so the example runs on an empty
database. See examples/README.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

from services.taskmanager.runtime.connectors import datagen, sql, sql_source


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="batch_sql_to_parquet")
    p.add_argument("--table", default="clicks")
    p.add_argument("--source-url", default=None, help="SQLAlchemy URL; default the pipeline database (ctx.catalog_url)")
    p.add_argument("--output", default=None, help="directory; default <checkpoint_dir>/output")
    p.add_argument("--seed-events", type=int, default=2000, help="rows to create if the table is missing")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def seed_table(url: str, table: str, n: int, seed: int, job_id: str) -> None:
    """Create `table` with the first `n` datagen events, upserted by `i` so that a retried or
    concurrent seeding leaves the same rows."""
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("i", T.LongType()),
            T.StructField("user_id", T.StringType()),
            T.StructField("url", T.StringType()),
            T.StructField("event_time", T.TimestampType()),
        ]
    )
    data = pa.Table.from_batches([datagen.generate_batch(seed, 0, n)])
    sink = sql.SqlTableSink(url, table, sink_id=f"{job_id}:seed:{table}", key_columns=["i"])
    try:
        sink.write_arrow(data, 0, schema)
    finally:
        sink.close()


def build(ctx):
    args = parse_args(ctx.args)
    url = args.source_url or ctx.config.get("source_url") or ctx.catalog_url
    if not sql_source.table_exists(url, args.table):
        seed_table(url, args.table, args.seed_events, args.seed, ctx.job_id)
    clicks = ctx.sources.sql_table(args.table, url=url)
    daily = (
        clicks.withColumn("day", F.to_date("event_time"))
        .groupBy("day", "url")
        .agg(
            F.count("*").alias("clicks"),
            F.countDistinct("user_id").alias("users"),
            F.min("event_time").alias("first_click"),
            F.max("event_time").alias("last_click"),
        )
        .orderBy("day", "url")
    )
    output = args.output or str(Path(ctx.checkpoint_dir) / "output")
    return ctx.sinks.files(daily, output, format="parquet", mode="overwrite")
