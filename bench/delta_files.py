"""Files in a Delta table after 1,000 micro-batches, with and without the sink's compaction.

A plain Spark session (local[2], the drivers' settings) runs bench/pipelines/redis_to_delta.py's
Headrace sink over a Redis stream of 1,000 entries of 10 events, one entry per micro-batch: 1,000
commits of one small file each. Variants, one after the other:
  none      no upkeep
  compact   optimize.every=100, vacuum.every=500 with vacuum.retention "0 s" (no snapshot pins one)
Reported per variant: the files of the table's latest version (what a reader opens, by delta-rs),
data files on disk, the run's time and the median time per micro-batch.

usage: python bench/delta_files.py [--batches 1000] [--variants none,compact] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs
from bench.checkpoint_overhead import append_entries, machine
from bench.delta_watch import LogWatch, data_files
from bench.throughput import click_entries

VARIANTS = {"none": {}, "compact": {"optimize.every": "100", "vacuum.every": "500", "vacuum.retention": "0 s"}}


def run(spark, home: Path, source: str, variant: str, batches: int, per_entry: int) -> dict:
    from deltalake import DeltaTable

    from services.taskmanager.runtime.connectors import SinkOwner
    from services.taskmanager.runtime.context import PipelineContext

    stream = f"events_{variant}"
    append_entries(source, stream, click_entries(batches * per_entry, per_entry=per_entry))
    args = ["--stream", stream, "--source-url", source, "--table", variant, "--max-entries-per-trigger", "1"]
    args += [a for k, v in VARIANTS[variant].items() for a in ("--option", f"{k}={v}")]
    from bench.pipelines.redis_to_delta import build

    ctx = PipelineContext(
        spark,
        job_id=f"bench-{variant}",
        args=args,
        parallelism=2,
        checkpoint_dir=str(home / "chk"),
        redis_url=source,
        lake_dir=str(home / "lake"),
    )
    handle = build(ctx)
    handle.prepare(1, -1, SinkOwner(lineage=f"bench-{variant}", job_id=f"bench-{variant}"))
    table = home / "lake" / variant
    watch = LogWatch(table)
    t0 = time.monotonic()
    query = handle.start(str(home / "chk" / variant))
    try:
        while watch.commits_with_rows < batches:
            if query.exception() is not None:
                raise SystemExit(f"{variant}: {query.exception()}")
            watch.poll()
            time.sleep(0.2)
        elapsed = time.monotonic() - t0
        durations = [p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress]
    finally:
        query.stop()
    live = len(DeltaTable(str(table)).file_uris())
    ops = [h["operation"] for h in DeltaTable(str(table)).history()]
    return {
        "variant": variant,
        "batches": watch.commits_with_rows,
        "rows": watch.rows,
        "live_files": live,
        "files_on_disk": data_files(table),
        "seconds": round(elapsed, 1),
        "median_batch_ms": statistics.median(durations) if durations else None,
        "optimize_runs": ops.count("OPTIMIZE"),
        "vacuum_runs": ops.count("VACUUM END"),
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--per-entry", type=int, default=10, help="events per entry, i.e. per micro-batch")
    p.add_argument("--variants", default="none,compact")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.batches = 30
        VARIANTS["compact"] = {"optimize.every": "10", "vacuum.every": "25", "vacuum.retention": "0 s"}
    home = Path(tempfile.mkdtemp(prefix="hr-delta-files-"))
    procs = Procs(home, {})
    try:
        source = procs.redis()
        from services.taskmanager.runtime.connectors import register_data_sources
        from services.taskmanager.runtime.spark_session import build_spark

        spark = build_spark(2, home / "spark", shuffle_partitions=4)
        register_data_sources(spark)
        print(f"machine: {machine()}; {args.batches} micro-batches of {args.per_entry} events", flush=True)
        out = []
        for variant in args.variants.split(","):
            r = run(spark, home, source, variant, args.batches, args.per_entry)
            out.append(r)
            print(json.dumps(r), flush=True)
        print("| upkeep | micro-batches | files in the latest version | data files on disk | run | median batch |")
        print("|---|---|---|---|---|---|")
        for r in out:
            print(
                f"| {r['variant']} | {r['batches']} | {r['live_files']} | {r['files_on_disk']} | {r['seconds']} s "
                f"| {r['median_batch_ms']} ms |"
            )
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
