"""Click counts per URL per one-minute event-time window, streamed into a SQL table.

datagen clicks -> withWatermark(event_time) -> count per (1-minute tumbling window, url)
-> SQL table upserted by (window_start, window_end, url), output mode `update`.

The generator's out-of-orderness (max_delay_ms) stays below the watermark delay, so no event
is dropped as late and the table ends with exact counts that `generate_events` can predict.
See examples/README.md for the program arguments.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="clickstream")
    p.add_argument("--total", type=int, default=3000, help="events to generate (bounded)")
    p.add_argument("--rate", type=float, default=300.0, help="events per second")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--events-per-minute", type=int, default=600, help="event-time density: 3000 events at 600/min span 5 minutes"
    )
    p.add_argument("--max-delay-ms", type=int, default=5000, help="out-of-orderness of event time")
    p.add_argument("--watermark", default="10 seconds")
    p.add_argument("--table", default="clicks_per_minute")
    p.add_argument("--sink-url", default=None, help="SQLAlchemy URL; default the pipeline database (ctx.catalog_url)")
    p.add_argument("--trigger", default=None, help='processing-time trigger, e.g. "1 second"')
    return p.parse_args(argv)


def build(ctx):
    args = parse_args(ctx.args)
    clicks = ctx.sources.datagen(
        seed=args.seed,
        total=args.total,
        rows_per_second=args.rate,
        events_per_minute=args.events_per_minute,
        max_delay_ms=args.max_delay_ms,
    )
    counts = (
        clicks.withWatermark("event_time", args.watermark).groupBy(F.window("event_time", "1 minute"), "url").count()
    )
    sink_url = args.sink_url or ctx.config.get("sink_url") or ctx.catalog_url
    return ctx.sinks.sql_table(
        counts,
        args.table,
        key_columns=["window_start", "window_end", "url"],
        url=sink_url,
        output_mode="update",
        trigger=args.trigger,
    )
