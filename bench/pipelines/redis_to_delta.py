"""Events from a Redis stream appended to a Delta table: the Delta benchmarks' pipeline
(bench/delta_throughput.py, delta_latency.py, delta_files.py).

  --sink headrace  ctx.sinks.delta: Headrace's exactly-once sink (foreachBatch, transaction
                   versions, fencing, snapshot pins), as a job submitted to Headrace runs it
  --sink native    Delta's own streaming sink (`writeStream.format("delta")`), as a bare PySpark
                   script would write the same table (bench/bare_spark.py)
"""

from __future__ import annotations

import argparse

SCHEMA = "key STRING, n BIGINT, value BIGINT, event_time TIMESTAMP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="redis_to_delta")
    p.add_argument("--stream", default="events")
    p.add_argument("--source-url", default=None)
    p.add_argument("--table", required=True, help="the table's path")
    p.add_argument("--sink", choices=("headrace", "native"), default="headrace")
    p.add_argument("--max-entries-per-trigger", type=int, default=None)
    p.add_argument("--trigger", default=None)
    p.add_argument("--option", action="append", default=[], help="KEY=VALUE: a sink option (headrace)")
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    events = ctx.sources.redis_stream(
        args.stream, schema=SCHEMA, url=args.source_url, max_entries_per_trigger=args.max_entries_per_trigger
    )
    if args.sink == "native":
        from services.taskmanager.runtime.connectors import SinkHandle

        return SinkHandle(
            name="delta-native",
            df=events,
            trigger=args.trigger,
            configure=lambda w: w.format("delta").option("path", args.table),
        )
    options = dict(o.split("=", 1) for o in args.option)
    return ctx.sinks.delta(events, args.table, options=options, trigger=args.trigger)
