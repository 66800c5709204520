"""What Delta's log checkpoint adds to the commit that writes it: the Delta latency benchmark's tail.

Delta writes a checkpoint of a table's log inside every commit whose version is a multiple of
`delta.checkpointInterval` (10 by default). One SparkSession built like a TaskManager's driver
(services/taskmanager/runtime/spark_session.py, the Delta sink's snapshot partitions) appends
--rows rows --commits times to a table of its own per variant through the Delta sink's own
idempotent write (connectors/delta_idempotent_write.py), timed around each write. Reported per
variant: the median of the other commits and the mean and maximum of the checkpoint commits, the
first --skip commits left out (the JIT). Variants alternate within a round:

  sink                    the Delta sink's append as it is
  no-stats-struct         checkpoints without the `stats_parsed` struct column (table property
                          delta.checkpoint.writeStatsAsStruct=false, through the session default)
  one-snapshot-partition  the log's state rebuilt in one partition, not one per driver core
  delta-rs                the table created as the sink creates it (no checkpoint inside a commit)
                          and the sink's own checkpoint with delta-rs after every tenth commit
                          (connectors/delta_log_checkpoint.py), timed with its commit

--jobs lists the Spark jobs of the last checkpoint commit of each variant with their durations,
read from the driver's Spark UI (its REST API): how much of the commit is Spark jobs at all.

usage: python3 bench/delta_checkpoint_cost.py [--commits 61] [--rounds 2] [--variants sink,...] [--jobs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_overhead import machine
from services.taskmanager.runtime.connectors.delta_idempotent_write import write_once
from services.taskmanager.runtime.connectors.delta_log_checkpoint import LogCheckpoints, creation_properties

INTERVAL = 10  # Delta's default delta.checkpointInterval
VARIANTS: dict[str, dict[str, str]] = {
    "sink": {},
    "no-stats-struct": {"spark.databricks.delta.properties.defaults.checkpoint.writeStatsAsStruct": "false"},
    "one-snapshot-partition": {"spark.databricks.delta.snapshotPartitions": "1"},
    "delta-rs": {},
}
SINK_CHECKPOINTS = {"delta-rs"}  # variants whose checkpoints the sink writes


def ui_time(text: str) -> float:
    """A Spark UI REST timestamp ("2026-12-02T15:51:01.123GMT") in seconds."""
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def job_lines(spark, group: str) -> list[str]:
    """One line per Spark job of a job group: its duration, tasks and description."""
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/jobs"
    with urllib.request.urlopen(url, timeout=30) as reply:
        jobs = [j for j in json.load(reply) if j.get("jobGroup") == group]
    lines = []
    for job in sorted(jobs, key=lambda j: j["jobId"]):
        took = (
            (ui_time(job["completionTime"]) - ui_time(job["submissionTime"])) * 1000 if "completionTime" in job else -1
        )
        lines.append(
            f"job {job['jobId']}: {took:.0f} ms, {job['numTasks']} tasks, {job.get('description', '')[-60:]!r}"
        )
    return lines


def commit_times(spark, rows, schema, path: str, commits: int, sink_checkpoints: bool) -> list[tuple[int, float, str]]:
    """(version, seconds, job group) of each of `commits` appends to a new table at `path`; with
    `sink_checkpoints` created and checkpointed as the Delta sink does, each checkpoint timed with
    the commit it follows."""
    properties = creation_properties(INTERVAL) if sink_checkpoints else {}
    checkpoints = LogCheckpoints(path, INTERVAL)
    spark.createDataFrame(rows, schema).limit(0).write.format("delta").options(**properties).save(path)  # version 0
    took = []
    for i in range(commits):
        df = spark.createDataFrame(rows, schema)
        group = f"{path}#{i}"
        spark.sparkContext.setJobGroup(group, f"Delta commit {i + 1}")
        started = time.perf_counter()
        write_once(spark, df, path, app_id="bench", version=i, mode="append", options={}, user_metadata=f"commit {i}")
        if sink_checkpoints:
            checkpoints.committed(spark, i + 1, properties)
        took.append((i + 1, time.perf_counter() - started, group))
    return took


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--commits", type=int, default=61)
    p.add_argument("--rows", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--jobs", action="store_true", help="list the Spark jobs of each variant's last checkpoint commit")
    args = p.parse_args()
    names = args.variants.split(",")
    if unknown := [n for n in names if n not in VARIANTS]:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if args.commits < args.skip + INTERVAL:
        raise SystemExit(f"--commits must be at least --skip + {INTERVAL} to reach a checkpoint commit")
    from services.taskmanager.runtime.connectors.delta_sink import SNAPSHOT_PARTITIONS_CONF
    from services.taskmanager.runtime.spark_session import build_spark

    home = Path(tempfile.mkdtemp(prefix="hr-delta-checkpoint-"))
    spark = build_spark(2, home / "driver", shuffle_partitions=2, python_forkserver=True, ui=args.jobs)
    spark.conf.set(SNAPSHOT_PARTITIONS_CONF, "2")  # what the Delta sink sets on a driver of 2 cores
    sample = spark.range(args.rows).selectExpr(
        "cast(id as string) key", "id n", "id value", "current_timestamp() event_time"
    )
    rows, schema = sample.collect(), sample.schema
    print(f"machine: {machine()}; {args.commits} commits of {args.rows} rows per table, first {args.skip} left out")
    print("| round | variant | other commits, median | checkpoint commits, mean | max |\n|---|---|---|---|---|")
    try:
        for rnd in range(args.rounds):
            for name in names:
                conf = VARIANTS[name]
                before = {k: spark.conf.get(k, None) for k in conf}
                for key, value in conf.items():
                    spark.conf.set(key, value)
                try:
                    took = commit_times(
                        spark, rows, schema, str(home / f"{name}-{rnd}"), args.commits, name in SINK_CHECKPOINTS
                    )
                finally:
                    for key, old in before.items():
                        spark.conf.set(key, old) if old is not None else spark.conf.unset(key)
                measured = took[args.skip :]
                checkpoints = [t for v, t, _ in measured if v % INTERVAL == 0]
                others = [t for v, t, _ in measured if v % INTERVAL != 0]
                print(
                    f"| {rnd + 1} | {name} | {statistics.median(others) * 1000:.0f} ms | "
                    f"{statistics.mean(checkpoints) * 1000:.0f} ms | {max(checkpoints) * 1000:.0f} ms |",
                    flush=True,
                )
                if args.jobs:
                    version, seconds, group = [c for c in took if c[0] % INTERVAL == 0][-1]
                    print(f"    {name}: checkpoint commit {version}, {seconds * 1000:.0f} ms:")
                    for line in job_lines(spark, group):
                        print(f"      {line}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
