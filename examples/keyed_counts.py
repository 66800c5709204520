"""Count and sum per key of events that an outside producer writes into a Redis stream.

    XADD <stream> * json '{"key": "k3", "n": 17, "value": 17, "event_time": "2026-11-22T10:00:00.170Z"}'

Two shapes of the same stateful job, for checkpoint, savepoint and failover drills:
  --sink sql      running count/sum per key, upserted into a SQL table by key (output mode update)
  --sink parquet  count/sum per key per tumbling event-time window, appended to Parquet files once
                  the watermark closes the window (output mode append)
The stream is unbounded: the job runs until it is cancelled or stopped with a savepoint.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="keyed_counts")
    p.add_argument("--stream", default="events")
    p.add_argument(
        "--source-url", default=None, help="Redis URL of the source stream when it is not in the cluster's Redis"
    )
    p.add_argument("--sink", choices=("sql", "parquet"), default="sql")
    p.add_argument("--table", default="keyed_counts", help="SQL sink: output table")
    p.add_argument("--path", default=None, help="parquet sink: output directory")
    p.add_argument(
        "--sink-url", default=None, help="SQL sink: SQLAlchemy URL; default the pipeline database (ctx.catalog_url)"
    )
    p.add_argument("--window", default="10 seconds", help="parquet sink: tumbling window")
    p.add_argument("--watermark", default="0 seconds", help="parquet sink: watermark delay")
    p.add_argument("--trigger", default=None, help='processing-time trigger, e.g. "500 milliseconds"')
    p.add_argument("--max-entries-per-trigger", type=int, default=None)
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    events = ctx.sources.redis_stream(
        args.stream, schema=SCHEMA, url=args.source_url, max_entries_per_trigger=args.max_entries_per_trigger
    )
    if args.sink == "sql":
        totals = events.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
        return ctx.sinks.sql_table(
            totals,
            args.table,
            key_columns=["key"],
            url=args.sink_url or ctx.config.get("sink_url") or ctx.catalog_url,
            output_mode="update",
            trigger=args.trigger,
        )
    windows = (
        events.withWatermark("event_time", args.watermark)
        .groupBy(F.window("event_time", args.window), "key")
        .agg(F.count("*").alias("count"), F.sum("value").alias("total"))
    )
    if not args.path:
        # Not a per-attempt directory: every attempt and every job resumed from a savepoint must
        # keep writing to the same place.
        raise ValueError("--sink parquet needs --path DIR (a directory every TaskManager can reach)")
    return ctx.sinks.files(windows, args.path, format="parquet", trigger=args.trigger)
