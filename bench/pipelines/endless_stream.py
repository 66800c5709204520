"""An unbounded clickstream for failover benchmarks: counts per URL per minute, forever."""

from pyspark.sql import functions as F


def build(ctx):
    clicks = ctx.sources.datagen(seed=7, rows_per_second=200, events_per_minute=600, max_delay_ms=2000)
    counts = clicks.withWatermark("event_time", "10 seconds").groupBy(F.window("event_time", "1 minute"), "url").count()
    return ctx.sinks.sql_table(
        counts,
        f"bench_failover_{ctx.job_id[:8]}",
        key_columns=["window_start", "window_end", "url"],
        output_mode="update",
    )
