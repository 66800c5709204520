"""The counting pipeline (count and sum per key into a SQL table) with a user function that costs
a fixed time per event: a sleep, so that it costs the same on a loaded machine, run in each of the
task's read partitions (one per unit of parallelism) side by side. One core processes 1000 / --cost-ms events per
second, two twice that: the autoscaler's end-to-end pipeline (tests/e2e/test_deployments_e2e.py)."""

from __future__ import annotations

import argparse
import time

from pyspark.sql import functions as F

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def build(ctx):
    p = argparse.ArgumentParser(prog="slow_counts")
    p.add_argument("--stream", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--sink-url", required=True)
    p.add_argument("--cost-ms", type=float, default=2.0)
    args = p.parse_args(ctx.args)
    cost_s = args.cost_ms / 1000

    def work(batches):
        for batch in batches:
            time.sleep(cost_s * len(batch))
            yield batch

    # The work runs where the stream is read: in as many partitions as the task's parallelism
    # (a warm driver's local[N] serves any parallelism up to N; its shuffle stages use all N).
    events = ctx.sources.redis_stream(args.stream, schema=SCHEMA)
    worked = events.mapInPandas(work, schema=events.schema)
    totals = worked.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
    return ctx.sinks.sql_table(totals, args.table, key_columns=["key"], url=args.sink_url, output_mode="update")
