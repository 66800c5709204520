"""What one small Delta commit costs, before any pipeline: the floor under the Delta sink's latency.

One SparkSession built like a TaskManager's driver (services/taskmanager/runtime/spark_session.py,
with the Delta sink's snapshot partitions), appending --rows rows --commits times to a table of its
own, timed around each write; variants alternate within a round so the machine's noise falls on
all of them:

  parquet          a plain Parquet append of the same rows (no log, no transaction): the write job
  delta            a Delta append with a transaction id and version, as the Delta sink writes
  delta-no-stats   ... without per-file column statistics (spark.databricks.delta.stats.collect)
  delta-no-crc     ... without the checksum file after each commit
  delta-ckpt-100   ... with a log checkpoint every 100 commits instead of every 10
  delta-no-txn     a Delta append without the transaction id (what the idempotent write costs)
  delta-lean       the sink's append with none of stats, checksum and the 10-commit checkpoint
  delta-1-snapshot-partition  the sink's append with the log's state in one partition, not 2
  write-once       the Delta sink's own idempotent append (connectors/delta_idempotent_write.py):
                   the app's version read from the checksum file, not by a state reconstruction

The first --skip commits of each table are left out (the JIT and the table's first versions).

--jobs prints, per variant, the Spark jobs one commit ran (their stages' names and task counts),
from the last commit of the table: what a commit does besides writing its rows.

usage: python3 bench/delta_commit_cost.py [--commits 40] [--rows 10] [--rounds 2] [--jobs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_overhead import machine, percentile
from services.taskmanager.runtime.connectors.delta_idempotent_write import write_once

NO_STATS = {"spark.databricks.delta.stats.collect": "false"}
NO_CRC = {"spark.databricks.delta.writeChecksumFile.enabled": "false"}
CKPT_100 = {"spark.databricks.delta.properties.defaults.checkpointInterval": "100"}
# name -> (format, session settings, whether the write carries a transaction id and version)
VARIANTS: dict[str, tuple[str, dict[str, str], bool]] = {
    "parquet": ("parquet", {}, False),
    "delta": ("delta", {}, True),
    "delta-no-stats": ("delta", NO_STATS, True),
    "delta-no-crc": ("delta", NO_CRC, True),
    "delta-ckpt-100": ("delta", CKPT_100, True),
    "delta-no-txn": ("delta", {}, False),
    "delta-lean": ("delta", {**NO_STATS, **NO_CRC, **CKPT_100}, True),
    "delta-1-snapshot-partition": ("delta", {"spark.databricks.delta.snapshotPartitions": "1"}, True),
    "write-once": ("write-once", {}, True),
}


def jobs_of_group(spark, group: str) -> list[str]:
    """One line per Spark job of a job group: its stages' names and task counts."""
    tracker = spark.sparkContext.statusTracker()
    lines = []
    for job_id in sorted(tracker.getJobIdsForGroup(group)):
        job = tracker.getJobInfo(job_id)
        stages = [tracker.getStageInfo(s) for s in (job.stageIds if job else [])]
        lines.append(f"job {job_id}: " + "; ".join(f"{st.name} ({st.numTasks} tasks)" for st in stages if st))
    return lines


def commit_times(
    spark, rows, schema, path: str, fmt: str, conf: dict[str, str], txn: bool, commits: int
) -> list[float]:
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        took = []
        for i in range(commits):
            df = spark.createDataFrame(rows, schema)
            if fmt == "write-once":
                if i == 0:
                    df.limit(0).write.format("delta").save(path)
                spark.sparkContext.setJobGroup(f"{path}#{i}", f"commit {i}")
                t = time.perf_counter()
                write_once(
                    spark, df, path, app_id="bench", version=i, mode="append", options={}, user_metadata=f"commit {i}"
                )
                took.append(time.perf_counter() - t)
                continue
            writer = df.write.format(fmt).mode("append")
            if txn:
                writer = writer.option("txnAppId", "bench").option("txnVersion", str(i))
            spark.sparkContext.setJobGroup(f"{path}#{i}", f"commit {i}")
            t = time.perf_counter()
            writer.save(path)
            took.append(time.perf_counter() - t)
        return took
    finally:
        for k in conf:
            spark.conf.unset(k)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--commits", type=int, default=40)
    p.add_argument("--rows", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--jobs", action="store_true", help="print the Spark jobs of each table's last commit")
    args = p.parse_args()
    names = args.variants.split(",")
    if unknown := [n for n in names if n not in VARIANTS]:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    from services.taskmanager.runtime.connectors.delta_sink import SNAPSHOT_PARTITIONS_CONF
    from services.taskmanager.runtime.spark_session import build_spark

    home = Path(tempfile.mkdtemp(prefix="hr-delta-commit-"))
    spark = build_spark(2, home / "driver", shuffle_partitions=2, python_forkserver=True)
    spark.conf.set(SNAPSHOT_PARTITIONS_CONF, "2")  # what the Delta sink sets on a driver of 2 cores
    sample = spark.range(args.rows).selectExpr(
        "cast(id as string) key", "id n", "id value", "current_timestamp() event_time"
    )
    rows, schema = sample.collect(), sample.schema
    print(
        f"machine: {machine()}; {args.commits} commits of {args.rows} rows per table, first {args.skip} left out",
        flush=True,
    )
    print("| round | variant | median | p90 | max |\n|---|---|---|---|---|")
    try:
        for rnd in range(args.rounds):
            for name in names:
                fmt, conf, txn = VARIANTS[name]
                took = commit_times(spark, rows, schema, str(home / f"{name}-{rnd}"), fmt, conf, txn, args.commits)[
                    args.skip :
                ]
                print(
                    f"| {rnd + 1} | {name} | {statistics.median(took) * 1000:.0f} ms | "
                    f"{percentile(took, 0.9) * 1000:.0f} ms | {max(took) * 1000:.0f} ms |",
                    flush=True,
                )
                if args.jobs:
                    for line in jobs_of_group(spark, f"{home / f'{name}-{rnd}'}#{args.commits - 1}"):
                        print(f"    {name}: {line}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
