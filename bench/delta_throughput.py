"""Throughput of Redis -> Delta append through Headrace versus bare PySpark writing the same kind of
table with Delta's own streaming sink, alternating in one run on one machine.

An outside redis-server holds N events (packed Arrow entries of 1000 events). Each run reads the
whole stream with bench/pipelines/redis_to_delta.py into a Delta table of its own, parallelism 2:
  headrace  submitted over REST to a local cluster like `headrace up`'s (2 TaskManagers with 2
            slots, a warm driver each, PostgreSQL catalog): ctx.sinks.delta, Headrace's exactly-once
            sink (a foreachBatch commit per micro-batch with transaction versions, fencing and the
            snapshot's version), checkpoints every 10 s as by default
  bare      bench/bare_spark.py: a plain SparkSession with the Delta jars and the sink session
            settings Headrace's drivers have, `writeStream.format("delta")`, Delta's own sink
The table's log is polled (every 0.1 s, bench/delta_watch.py) for both:
  total   N / (submission or process start -> N rows committed)
  steady  rows after the first commit holding rows / the time from it to the last
and the ratio headrace / bare of the medians of each.

usage: python bench/delta_throughput.py [--events 3000000] [--max-entries 200] [--rounds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs, stop_group
from bench.checkpoint_overhead import DEFAULT_PG, append_entries, drop_pg, fresh_pg, machine
from bench.delta_watch import LogWatch
from bench.submit_latency import wait_warm
from bench.throughput import click_entries
from shared.jars import DEFAULT_CACHE_DIR, JarCache
from tests.clusters import Rest, start_cluster

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "bench" / "pipelines" / "redis_to_delta.py"
BARE = ROOT / "bench" / "bare_spark.py"
# What Headrace's Delta sink sets on a driver of 2 cores (connectors/delta_sink.py): the bare run
# gets it too, so the ratio measures the sink, not that setting.
SNAPSHOT_PARTITIONS = {"spark.databricks.delta.snapshotPartitions": "2"}


def watch(table: Path, events: int, t0: float, timeout_s: float, alive=lambda: True) -> dict:
    w = LogWatch(table)
    t_first = rows_first = None
    deadline = t0 + timeout_s
    while w.rows < events:
        if time.monotonic() > deadline:
            raise SystemExit(f"{table}: {w.rows} of {events} rows after {timeout_s:.0f} s")
        if not alive():
            raise SystemExit(f"{table}: the run ended with {w.rows} of {events} rows in the table")
        w.poll()
        if w.rows and t_first is None:
            t_first, rows_first = time.monotonic(), w.rows
        time.sleep(0.1)
    now = time.monotonic()
    if w.rows != events:
        raise SystemExit(f"{table}: {w.rows} rows committed, not {events}")
    steady = now - (t_first or now)
    return {
        "first_s": round((t_first or now) - t0, 2),
        "total_s": round(now - t0, 2),
        "total_eps": round(events / (now - t0)),
        "steady_eps": round((events - (rows_first or 0)) / steady) if steady > 0 else None,
        "commits": w.commits_with_rows,
    }


def run_headrace(rest: Rest, jar: str, table: Path, args: list[str], events: int, timeout_s: float) -> dict:
    t0 = time.monotonic()
    job = rest.run(jar, parallelism=2, jobName=table.name, programArgsList=args)
    try:
        return watch(table, events, t0, timeout_s)
    finally:
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)


def run_bare(home: Path, table: Path, args: list[str], events: int, timeout_s: float, settings) -> dict:
    (home / "logs").mkdir(parents=True, exist_ok=True)
    conf = {**JarCache(DEFAULT_CACHE_DIR).spark_conf(), **SNAPSHOT_PARTITIONS}
    confs = [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    cmd = [
        sys.executable,
        str(BARE),
        "--parallelism",
        "2",
        "--checkpoint",
        str(home / "bare-checkpoints" / table.name),
        "--shuffle-partitions",
        str(settings.spark_shuffle_partitions),
        "--driver-memory",
        settings.driver_memory,
        *confs,
        str(PIPELINE),
        "--",
        *args,
    ]
    t0 = time.monotonic()
    with open(home / "logs" / f"{table.name}.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return watch(table, events, t0, timeout_s, alive=lambda: proc.poll() is None)
    finally:
        stop_group(proc)


def median_of(results: list[dict], key: str) -> float:
    return statistics.median(r.get(key) or 0 for r in results)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=3_000_000)
    p.add_argument("--max-entries", type=int, default=200, help="packed entries of 1000 events per micro-batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark still works")
    args = p.parse_args()
    if args.smoke:
        args.events, args.rounds, args.max_entries = 20_000, 1, 5
    home = Path(tempfile.mkdtemp(prefix="hr-delta-throughput-"))
    procs = Procs(home, {})
    catalog_url = fresh_pg(DEFAULT_PG)
    cluster = None
    try:
        source = procs.redis()
        append_entries(source, "events", click_entries(args.events))
        cluster = start_cluster(
            home / "cluster",
            catalog_url=catalog_url,
            taskmanagers=2,
            slots=2,
            warm_drivers=1,
            restart_strategy={"type": "none"},
        )
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(PIPELINE)
        lake = Path(cluster.settings.lake)
        print(
            f"machine: {machine()}; {args.events:,} events, {args.max_entries} entries of 1000 per micro-batch, "
            f"parallelism 2",
            flush=True,
        )
        results: dict[str, list[dict]] = {"headrace": [], "bare": []}
        for rnd in range(args.rounds):
            for kind in ("headrace", "bare"):
                table = lake / f"{kind}_{rnd}"
                pargs = [
                    "--stream",
                    "events",
                    "--source-url",
                    source,
                    "--table",
                    str(table),
                    "--max-entries-per-trigger",
                    str(args.max_entries),
                    "--sink",
                    "headrace" if kind == "headrace" else "native",
                ]
                load = round(os.getloadavg()[0], 2)
                if kind == "headrace":
                    wait_warm(cluster, 1)
                    r = run_headrace(rest, jar, table, pargs, args.events, args.timeout)
                else:
                    r = run_bare(home, table, pargs, args.events, args.timeout, cluster.settings)
                r["load"] = load
                results[kind].append(r)
                print(
                    f"round {rnd + 1} {kind:8s} first commit {r['first_s']:6.2f} s  all {r['total_s']:6.2f} s  "
                    f"total {r['total_eps']:>9,} ev/s  steady {r['steady_eps'] or 0:>9,} ev/s  "
                    f"{r['commits']} commits  (load {load})",
                    flush=True,
                )
        print("| run | first commit | all | events/s whole run | steady events/s |")
        print("|---|---|---|---|---|")
        for kind, rs in results.items():
            print(
                f"| {kind} (median of {len(rs)}) | {median_of(rs, 'first_s'):.2f} s "
                f"| {median_of(rs, 'total_s'):.2f} s | {median_of(rs, 'total_eps'):,.0f} "
                f"| {median_of(rs, 'steady_eps'):,.0f} |"
            )
        for key in ("total_eps", "steady_eps"):
            ratio = median_of(results["headrace"], key) / max(1.0, median_of(results["bare"], key))
            print(f"headrace / bare, {key}: {ratio:.3f}")
    finally:
        if cluster is not None:
            cluster.stop()
        procs.stop()
        drop_pg(DEFAULT_PG, catalog_url)


if __name__ == "__main__":
    main()
