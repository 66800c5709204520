"""Count and sum per key, per tumbling event-time window, of JSON events read from Kafka, upserted
into a SQL table (PostgreSQL, or the pipeline database of `headrace up`).

    {"key": "k3", "n": 17, "value": 17, "event_time": "2026-11-22T10:00:00.170Z"}

The Kafka offsets each micro-batch read are in every checkpoint and savepoint, and the SQL sink
writes each micro-batch once, so the counts are exact through restarts, failovers and a resume
from a savepoint at another parallelism:

    headrace up --kafka
    headrace kafka create-topic events --partitions 2
    headrace run examples/kafka_to_postgres.py -p 2 --args "--topic events"
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kafka_to_postgres")
    p.add_argument("--topic", default="events")
    p.add_argument("--bootstrap-servers", default=None, help="default: the cluster's broker (headrace up --kafka)")
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--table", default="kafka_window_counts")
    p.add_argument("--sink-url", default=None, help="SQLAlchemy URL; default the pipeline database (ctx.catalog_url)")
    p.add_argument("--window", default="", help='a tumbling window such as "10 seconds"; none: running totals')
    p.add_argument("--watermark", default="10 seconds")
    p.add_argument("--trigger", default=None, help='processing-time trigger, e.g. "1 second"')
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    options = {"maxOffsetsPerTrigger": args.max_offsets_per_trigger} if args.max_offsets_per_trigger else None
    raw = ctx.sources.kafka(
        args.topic, bootstrap_servers=args.bootstrap_servers, starting_offsets=args.starting_offsets, options=options
    )
    events = raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e")).select("e.*")
    if args.window:
        counts = (
            events.withWatermark("event_time", args.watermark)
            .groupBy(F.window("event_time", args.window), "key")
            .agg(F.count("*").alias("count"), F.sum("value").alias("total"))
        )
        keys = ["window_start", "window_end", "key"]
    else:
        counts = events.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
        keys = ["key"]
    return ctx.sinks.sql_table(
        counts,
        args.table,
        key_columns=keys,
        url=args.sink_url or ctx.catalog_url,
        output_mode="update",
        trigger=args.trigger,
    )
