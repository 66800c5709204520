"""Latency to a visible row: an event written to a Redis stream -> a Delta commit holding it,
through Headrace's Delta sink (default trigger, and with the job option headrace.latency-mode)
and, for reference, through bare PySpark with Delta's own streaming sink, one after the other.

A producer thread (bench/latency.py's) XADDs single JSON events at --rate events/s, noting when
each was written; bench/pipelines/redis_to_delta.py appends them to a Delta table. A watcher polls
the table's log every --poll-ms (bench/delta_watch.py): a reader sees a commit once its file
exists, and its files' statistics give the highest event number in it; batches commit a prefix of
the stream, so every event up to that number is visible then. An event's latency = the first poll
that saw it - the time it was written (the poll adds up to --poll-ms). The first --warmup-s are
left out; then --duration-s of events are measured: p50, p90, p99, max.

Kinds: `headrace` (the sink as configured by default), `headrace-latency` (with the job option
headrace.latency-mode), `headrace-inline-log-checkpoint` (sink option logCheckpoint.every=0: Delta
writes the log's checkpoint inside every tenth commit with its Spark jobs, instead of the sink with
delta-rs after the commit), `headrace-log-checkpoint-100` (the sink checkpoints every 100 commits), `bare`.

usage: python bench/delta_latency.py [--duration-s 60] [--rate 100] [--kinds headrace,bare,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs, stop_group
from bench.checkpoint_overhead import DEFAULT_PG, drop_pg, fresh_pg, machine, percentile
from bench.delta_throughput import BARE, PIPELINE, SNAPSHOT_PARTITIONS
from bench.delta_watch import LogWatch
from bench.latency import Producer
from bench.submit_latency import wait_warm
from shared.jars import DEFAULT_CACHE_DIR, JarCache
from shared.job_options import LATENCY_MODE
from tests.clusters import Rest, start_cluster

# kind -> the Delta sink's options (bench/pipelines/redis_to_delta.py --option)
SINK_OPTIONS: dict[str, dict[str, str]] = {
    "headrace": {},
    "headrace-latency": {},
    "headrace-inline-log-checkpoint": {"logCheckpoint.every": "0"},
    "headrace-log-checkpoint-100": {"logCheckpoint.every": "100"},
}
KINDS = (*SINK_OPTIONS, "bare")


def measure(
    table: Path,
    source: str,
    stream: str,
    *,
    rate: float,
    warmup_s: float,
    duration_s: float,
    poll_s: float,
    alive=lambda: True,
) -> dict:
    total = int(rate * (warmup_s + duration_s))
    producer = Producer(source, stream, rate, 0, total)
    watch = LogWatch(table)
    seen_at: dict[int, float] = {}
    last = -1
    producer.start()
    deadline = time.monotonic() + warmup_s + duration_s + 60
    try:
        while last < total - 1:
            if time.monotonic() > deadline:
                raise SystemExit(f"{table}: events up to {last} of {total} visible when the time ran out")
            if not alive():
                raise SystemExit(f"{table}: the run ended with events up to {last} of {total} visible")
            watch.poll()
            now = time.monotonic()
            for k in range(last + 1, watch.max_value + 1):
                seen_at[k] = now
            last = max(last, watch.max_value)
            time.sleep(poll_s)
    finally:
        producer.stop.set()
        producer.join(5)
    skip = int(rate * warmup_s)
    lat = [seen_at[n] - producer.written[n] for n in range(skip, total) if n in producer.written]
    return {
        "events": len(lat),
        "p50_s": round(percentile(lat, 0.5), 3),
        "p90_s": round(percentile(lat, 0.9), 3),
        "p99_s": round(percentile(lat, 0.99), 3),
        "max_s": round(max(lat), 3),
        "commits": watch.commits_with_rows,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--duration-s", type=float, default=60)
    p.add_argument("--warmup-s", type=float, default=15)
    p.add_argument("--rate", type=float, default=100)
    p.add_argument("--poll-ms", type=float, default=20)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown kinds {unknown}; the kinds are {', '.join(KINDS)}")
    if args.smoke:
        args.duration_s, args.warmup_s, kinds = 5, 5, ["headrace"]
    home = Path(tempfile.mkdtemp(prefix="hr-delta-latency-"))
    procs = Procs(home, {})
    catalog_url = fresh_pg(DEFAULT_PG)
    cluster = None
    try:
        source = procs.redis()
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
            f"machine: {machine()}; {args.rate:g} events/s, {args.duration_s:g} s measured after {args.warmup_s:g} s",
            flush=True,
        )
        results = {}
        for kind in kinds:
            stream = kind.replace("-", "_")
            table = lake / stream
            pargs = [
                "--stream",
                stream,
                "--source-url",
                source,
                "--table",
                str(table),
                "--sink",
                "native" if kind == "bare" else "headrace",
                *[a for k, v in SINK_OPTIONS.get(kind, {}).items() for a in ("--option", f"{k}={v}")],
            ]
            load = round(os.getloadavg()[0], 2)
            if kind == "bare":
                conf = {**JarCache(DEFAULT_CACHE_DIR).spark_conf(), **SNAPSHOT_PARTITIONS}
                cmd = [
                    sys.executable,
                    str(BARE),
                    "--parallelism",
                    "2",
                    "--checkpoint",
                    str(home / "bare" / stream),
                    *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
                    str(PIPELINE),
                    "--",
                    *pargs,
                ]
                (home / "logs").mkdir(exist_ok=True)
                log = home / "logs" / f"{stream}.log"
                with open(log, "ab") as out:
                    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    deadline = time.monotonic() + 300
                    while "bare: query started" not in log.read_text(errors="replace"):
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise SystemExit(f"the bare query did not start; see {log}")
                        time.sleep(0.2)
                    r = measure(
                        table,
                        source,
                        stream,
                        rate=args.rate,
                        warmup_s=args.warmup_s,
                        duration_s=args.duration_s,
                        poll_s=args.poll_ms / 1000,
                        alive=lambda p=proc: p.poll() is None,
                    )
                finally:
                    stop_group(proc)
            else:
                wait_warm(cluster, 1)
                config = {LATENCY_MODE: "true"} if kind == "headrace-latency" else {}
                job = rest.run(jar, parallelism=2, jobName=kind, programArgsList=pargs, flinkConfiguration=config)
                try:
                    rest.wait_running_task(job, timeout_s=300)
                    r = measure(
                        table,
                        source,
                        stream,
                        rate=args.rate,
                        warmup_s=args.warmup_s,
                        duration_s=args.duration_s,
                        poll_s=args.poll_ms / 1000,
                    )
                finally:
                    rest.cancel(job)
                    rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
            r["load"] = load
            results[kind] = r
            print(
                f"{kind:30s} {r['events']} events: p50 {r['p50_s']:.3f} s  p90 {r['p90_s']:.3f} s  "
                f"p99 {r['p99_s']:.3f} s  max {r['max_s']:.3f} s  {r['commits']} commits  (load {load})",
                flush=True,
            )
        print(json.dumps(results))
    finally:
        if cluster is not None:
            cluster.stop()
        procs.stop()
        drop_pg(DEFAULT_PG, catalog_url)


if __name__ == "__main__":
    main()
