"""Keyed state that only grows, for bench/checkpoint_state_sizes.py: count and sum per key of a
Redis stream with examples/keyed_counts.py's schema, held in Spark's state store and never
emitted.

keyed_counts --sink sql would upsert every key a batch touched: with millions of distinct keys
the benchmark would time the sink, not the state. A filter no row passes, after the
aggregation, keeps the state (one row per key ever seen) and leaves every batch's output empty;
the sink still commits each batch, so batches and checkpoints behave as in a real job.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="keyed_state")
    p.add_argument("--stream", default="events")
    p.add_argument("--table", default="keyed_state")
    p.add_argument("--sink-url", default=None, help="SQLAlchemy URL of the sink; default the catalog DB")
    p.add_argument("--max-entries-per-trigger", type=int, default=None)
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    events = ctx.sources.redis_stream(args.stream, schema=SCHEMA, max_entries_per_trigger=args.max_entries_per_trigger)
    totals = events.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
    silent = totals.where(F.col("count") < 0)
    return ctx.sinks.sql_table(
        silent, args.table, key_columns=["key"], url=args.sink_url or ctx.catalog_url, output_mode="update"
    )
