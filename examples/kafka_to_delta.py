"""JSON events from Kafka into Delta Lake tables: every event appended once to a bronze table,
and, with --totals, the running count and sum per key MERGEd into a gold table by key.

    {"key": "k3", "n": 17, "value": 17, "event_time": "2026-11-22T10:00:00.170Z"}

The Kafka offsets each micro-batch read are in every checkpoint and savepoint, and the Delta sink
commits each micro-batch once (Delta's idempotent writes), so the tables are exact through
restarts, failovers and a resume from a savepoint at another parallelism; a restore from an older
savepoint (a rollback) first takes the batches after it back out of the table. Tables land in the
cluster's lake directory ($HEADRACE_HOME/lake):

    headrace up --kafka
    headrace kafka create-topic events --partitions 2
    headrace run examples/kafka_to_delta.py -p 2 --args "--topic events"
    headrace run examples/kafka_to_delta.py -p 2 --args "--topic events --totals --table events/totals"

Compaction: --optimize-every N runs OPTIMIZE after every N micro-batches (docs/runbooks/delta.md).
Read the tables with Spark (`spark.read.format("delta").load(...)`) or delta-rs
(`deltalake.DeltaTable(path).to_pyarrow_table()`).
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kafka_to_delta")
    p.add_argument("--topic", default="events")
    p.add_argument("--bootstrap-servers", default=None, help="default: the cluster's broker (headrace up --kafka)")
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--table", default="events/bronze", help="the table, relative to the lake directory")
    p.add_argument("--totals", action="store_true", help="count and sum per key (update mode, MERGE by key)")
    p.add_argument("--optimize-every", type=int, default=0, help="compact after every N micro-batches")
    p.add_argument("--trigger", default=None, help='processing-time trigger, e.g. "1 second"')
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    options = {"maxOffsetsPerTrigger": args.max_offsets_per_trigger} if args.max_offsets_per_trigger else None
    raw = ctx.sources.kafka(
        args.topic, bootstrap_servers=args.bootstrap_servers, starting_offsets=args.starting_offsets, options=options
    )
    events = raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"), "partition", "offset").select(
        "e.*", "partition", "offset"
    )
    upkeep = {"optimize.every": str(args.optimize_every)} if args.optimize_every else {}
    if args.totals:
        totals = events.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
        return ctx.sinks.delta(
            totals, args.table, key_columns=["key"], output_mode="update", options=upkeep, trigger=args.trigger
        )
    return ctx.sinks.delta(events, args.table, options=upkeep, trigger=args.trigger)
