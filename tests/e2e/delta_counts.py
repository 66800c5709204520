"""The end-to-end drills' Delta pipeline: numbered events from a Redis stream (tests/e2e/counting.py
Producer) into a Delta table in the lake directory.

  --mode append   every event, tagged with --tag (the pipeline's version), appended once
  --mode totals   count and sum per key, MERGEd into the table by key (output mode update)

--fail-at N makes every batch holding an event numbered N or more fail (a broken version).
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="delta_counts")
    p.add_argument("--stream", required=True)
    p.add_argument("--table", required=True, help="relative to the lake directory")
    p.add_argument("--mode", choices=("append", "totals"), default="append")
    p.add_argument("--tag", default="v1")
    p.add_argument("--fail-at", type=int, default=None)
    p.add_argument("--trigger", default=None)
    p.add_argument("--max-entries-per-trigger", type=int, default=None)
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    events = ctx.sources.redis_stream(args.stream, schema=SCHEMA, max_entries_per_trigger=args.max_entries_per_trigger)
    if args.fail_at is not None:
        events = events.withColumn(
            "n",
            F.when(
                F.col("n") >= args.fail_at,
                F.raise_error(F.lit(f"broken version {args.tag}: event {args.fail_at} or later")),
            ).otherwise(F.col("n")),
        )
    if args.mode == "totals":
        totals = events.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
        return ctx.sinks.delta(totals, args.table, key_columns=["key"], output_mode="update", trigger=args.trigger)
    tagged = events.select("key", "n", "value", F.lit(args.tag).alias("tag"))
    return ctx.sinks.delta(tagged, args.table, trigger=args.trigger)
