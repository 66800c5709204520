"""Kafka to Kafka, record for record (the value parsed for its number, written back as JSON): the
Kafka benchmarks' pipeline (bench/kafka_bench.py), run through Headrace and on bare PySpark.

    --delivery exactly-once | at-least-once   the sink (Headrace's transactions, or Spark's own)
    --low-latency                             producer linger 0 and consumer fetch wait 5 ms (what a
                                              latency-minded pipeline sets; the real-time runs use it)
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kafka_copy")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--delivery", default="exactly-once")
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--trigger", default=None)
    p.add_argument("--low-latency", action="store_true")
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    source_options = {"kafka.fetch.max.wait.ms": "5"} if args.low_latency else {}
    if args.max_offsets_per_trigger:
        source_options["maxOffsetsPerTrigger"] = str(args.max_offsets_per_trigger)
    records = ctx.sources.kafka(
        args.input,
        bootstrap_servers=args.bootstrap_servers,
        starting_offsets=args.starting_offsets,
        options=source_options,
    )
    out = records.select(
        F.col("key"),
        F.to_json(
            F.struct(
                F.get_json_object(F.col("value").cast("string"), "$.n").cast("long").alias("n"),
                F.col("partition"),
                F.col("offset"),
            )
        ).alias("value"),
    )
    sink_options = {"kafka.linger.ms": "0"} if args.low_latency else None
    return ctx.sinks.kafka(
        out,
        args.output,
        bootstrap_servers=args.bootstrap_servers,
        delivery=args.delivery,
        options=sink_options,
        trigger=args.trigger,
    )
