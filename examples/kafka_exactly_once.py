"""Kafka to Kafka, exactly once: every record of the input topic lands in the output topic once for
a `read_committed` consumer, whatever fails (a TaskManager, the JobManager, a broker).

Each record is parsed, enriched and written as JSON with its key. The sink writes every
micro-batch into a Kafka transaction committed when the next checkpoint is taken, so the output
becomes visible one checkpoint interval after it was read (set execution.checkpointing.interval
for the latency you want); `--delivery at-least-once` uses Spark's own sink instead (visible at
once, duplicates after a failure).

    headrace up --kafka
    headrace kafka create-topic orders --partitions 2
    headrace kafka create-topic orders-enriched --partitions 2
    headrace run examples/kafka_exactly_once.py -p 2 -D execution.checkpointing.interval="2 s" \\
        --args "--input orders --output orders-enriched"
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kafka_exactly_once")
    p.add_argument("--input", default="orders")
    p.add_argument("--output", default="orders-enriched")
    p.add_argument("--bootstrap-servers", default=None, help="default: the cluster's broker (headrace up --kafka)")
    p.add_argument("--delivery", default="exactly-once", help="exactly-once or at-least-once")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--trigger", default=None, help='processing-time trigger, e.g. "500 milliseconds"')
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    options = {"maxOffsetsPerTrigger": args.max_offsets_per_trigger} if args.max_offsets_per_trigger else None
    records = ctx.sources.kafka(args.input, bootstrap_servers=args.bootstrap_servers, options=options)
    enriched = records.select(
        F.col("key"),
        F.to_json(
            F.struct(
                F.col("value").cast("string").alias("payload"),
                F.col("partition").alias("source_partition"),
                F.col("offset").alias("source_offset"),
                F.col("timestamp").alias("source_time"),
            )
        ).alias("value"),
    )
    return ctx.sinks.kafka(
        enriched, args.output, bootstrap_servers=args.bootstrap_servers, delivery=args.delivery, trigger=args.trigger
    )
