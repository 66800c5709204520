"""Counts per key per 10 s tumbling event-time window of JSON events read from Kafka, upserted into
PostgreSQL with the highest event number of each window (`last_n`): bench/kafka_bench.py's latency
pipeline (bench/pipelines/click_windows.py's, on a Kafka source)."""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kafka_windows")
    p.add_argument("--topic", required=True)
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--sink-url", default=None)
    p.add_argument("--table", default="kafka_windows")
    p.add_argument("--trigger", default=None)
    p.add_argument("--low-latency", action="store_true", help="consumer fetch wait 5 ms")
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    options = {"kafka.fetch.max.wait.ms": "5"} if args.low_latency else None
    raw = ctx.sources.kafka(
        args.topic, bootstrap_servers=args.bootstrap_servers, starting_offsets="earliest", options=options
    )
    events = raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e")).select("e.*")
    counts = (
        events.withWatermark("event_time", "10 seconds")
        .groupBy(F.window("event_time", "10 seconds"), "key")
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
