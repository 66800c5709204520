"""Click counts per key per 10 s tumbling event-time window, from a Redis stream into PostgreSQL.

The throughput and latency benchmarks (bench/throughput.py, bench/latency.py) run this one file
both ways: submitted to Headrace, and as a plain PySpark script (bench/bare_spark.py) that builds
the same context with a SparkSession of its own.

redis_stream(key, n, value, event_time) -> withWatermark(event_time) -> count per
(10 s window, key) -> SQL table upserted by (window_start, window_end, key), output mode update.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="click_windows")
    p.add_argument("--stream", default="clicks")
    p.add_argument("--source-url", default=None)
    p.add_argument("--sink-url", default=None)
    p.add_argument("--table", default="click_windows")
    p.add_argument("--window", default="10 seconds")
    p.add_argument("--watermark", default="10 seconds")
    p.add_argument("--max-entries-per-trigger", type=int, default=None)
    p.add_argument("--trigger", default=None, help='processing-time trigger, e.g. "200 milliseconds"')
    p.add_argument("--start", default="0", help='"0": the whole stream, "$": only new entries')
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    clicks = ctx.sources.redis_stream(
        args.stream,
        schema=SCHEMA,
        url=args.source_url,
        start=args.start,
        max_entries_per_trigger=args.max_entries_per_trigger,
    )
    counts = (
        clicks.withWatermark("event_time", args.watermark)
        .groupBy(F.window("event_time", args.window), "key")
        .agg(F.count("*").alias("count"), F.max("n").alias("last_n"))
    )
    return ctx.sinks.sql_table(
        counts,
        args.table,
        key_columns=["window_start", "window_end", "key"],
        url=args.sink_url or ctx.catalog_url,
        output_mode="update",
        trigger=args.trigger,
    )
