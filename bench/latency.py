"""End-to-end latency of a trickle: an event written to a Redis stream -> its count committed in
PostgreSQL, through Headrace and through the same pipeline on bare PySpark, one after the other
in one run.

A producer thread XADDs single JSON events (what outside producers write) at --rate events/s,
noting each event's number and the time it was written. bench/pipelines/click_windows.py counts
them per key per 10 s window with a processing-time trigger (--trigger) and upserts the counts
with the highest event number of each window (`last_n`). A watcher polls the sink every
--poll-ms for max(last_n): batches commit a prefix of the stream, so every event up to that
number is committed by then. An event's latency = the first poll that saw it committed - the
time it was written (the poll adds up to --poll-ms). The first --warmup-s of each run are left
out (the query's first batches); then --duration-s of events are measured: p50, p90, p99, max.

usage: python bench/latency.py [--duration-s 120] [--rate 100] [--trigger "200 milliseconds"]
       [--only headrace|bare] [--smoke]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs, stop_group
from bench.checkpoint_overhead import DEFAULT_PG, drop_pg, fresh_pg, machine, percentile, pg_engine
from bench.submit_latency import wait_warm
from bench.throughput import KEYS, PIPELINE, start_bare
from tests.clusters import Rest, start_cluster


class Producer(threading.Thread):
    """XADDs event n at time start + n / rate (no drift), noting when each was written."""

    def __init__(self, url: str, stream: str, rate: float, first: int, count: int):
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.stream, self.rate, self.first, self.count = stream, rate, first, count
        self.written: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        for i in range(self.count):
            if self.stop.is_set():
                return
            delay = start + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            n = self.first + i
            event = {"key": f"/page/{n % KEYS}", "n": n, "value": 1,
                     "event_time": dt.datetime.now(dt.timezone.utc).isoformat()}
            self.client.xadd(self.stream, {"json": json.dumps(event)})
            self.written[n] = time.monotonic()


def committed_n(engine: sa.Engine, table: str) -> int:
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text(f'SELECT coalesce(max(last_n), -1) FROM "{table}"')).scalar())
    except sa.exc.ProgrammingError:
        return -1  # no batch has created the table yet


def measure(engine: sa.Engine, table: str, source: str, stream: str, *, rate: float, warmup_s: float,
            duration_s: float, poll_s: float, alive=lambda: True) -> dict:
    """Feed the stream for warmup + duration, then wait (bounded) for the last event's commit."""
    total = int(rate * (warmup_s + duration_s))
    producer = Producer(source, stream, rate, 0, total)
    seen_at: dict[int, float] = {}
    last = -1
    producer.start()
    deadline = time.monotonic() + warmup_s + duration_s + 60
    try:
        while last < total - 1:
            if time.monotonic() > deadline:
                raise SystemExit(f"{table}: events up to {last} of {total} committed when the time ran out")
            if not alive():
                raise SystemExit(f"{table}: the run ended with events up to {last} of {total} committed")
            n = committed_n(engine, table)
            now = time.monotonic()
            if n > last:
                for k in range(last + 1, n + 1):
                    seen_at[k] = now
                last = n
            time.sleep(poll_s)
    finally:
        producer.stop.set()
        producer.join(5)
    skip = int(rate * warmup_s)
    lat = [seen_at[n] - producer.written[n] for n in range(skip, total) if n in producer.written]
    return {"events": len(lat), "p50_s": round(percentile(lat, 0.5), 3), "p90_s": round(percentile(lat, 0.9), 3),
            "p99_s": round(percentile(lat, 0.99), 3), "max_s": round(max(lat), 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--duration-s", type=float, default=120)
    p.add_argument("--warmup-s", type=float, default=15)
    p.add_argument("--rate", type=float, default=100)
    p.add_argument("--trigger", default="200 milliseconds")
    p.add_argument("--poll-ms", type=float, default=20)
    p.add_argument("--only", choices=("headrace", "bare"), default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark still works")
    args = p.parse_args()
    if args.smoke:
        args.duration_s, args.warmup_s, args.only = 5, 5, "headrace"
    home = Path(tempfile.mkdtemp(prefix="hr-latency-"))
    procs = Procs(home, {})
    sink_url, catalog_url = fresh_pg(DEFAULT_PG), fresh_pg(DEFAULT_PG)
    engine = pg_engine(sink_url)
    cluster = None
    results = {}
    try:
        source = procs.redis()
        cluster = start_cluster(home / "cluster", catalog_url=catalog_url, taskmanagers=2, slots=2, warm_drivers=1,
                                restart_strategy={"type": "none"})
        settings = cluster.settings
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(PIPELINE)
        print(f"machine: {machine()}; {args.rate:g} events/s, trigger {args.trigger}, "
              f"{args.duration_s:g} s measured after {args.warmup_s:g} s", flush=True)
        for kind in [args.only] if args.only else ["headrace", "bare"]:
            stream = f"trickle_{kind}"
            pargs = ["--stream", stream, "--source-url", source, "--sink-url", sink_url, "--table", kind,
                     "--trigger", args.trigger]
            load = round(os.getloadavg()[0], 2)
            if kind == "headrace":
                wait_warm(cluster, 1)
                job = rest.run(jar, parallelism=2, jobName=kind, programArgsList=pargs)
                try:
                    rest.wait_running_task(job, timeout_s=120)
                    r = measure(engine, kind, source, stream, rate=args.rate, warmup_s=args.warmup_s,
                                duration_s=args.duration_s, poll_s=args.poll_ms / 1000)
                finally:
                    rest.cancel(job)
                    rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
            else:
                proc = start_bare(home, table=kind, args=pargs, shuffle_partitions=settings.spark_shuffle_partitions,
                                  driver_memory=settings.driver_memory)
                try:
                    # The producer starts once the query runs, as it does for Headrace.
                    log = home / "logs" / f"{kind}.log"
                    deadline = time.monotonic() + 180
                    while "bare: query started" not in log.read_text(errors="replace"):
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise SystemExit(f"the bare query did not start; see {log}")
                        time.sleep(0.2)
                    r = measure(engine, kind, source, stream, rate=args.rate, warmup_s=args.warmup_s,
                                duration_s=args.duration_s, poll_s=args.poll_ms / 1000,
                                alive=lambda: proc.poll() is None)  # noqa: B023 - used within this iteration
                finally:
                    stop_group(proc)
            r["load"] = load
            results[kind] = r
            print(f"{kind:8s} {r['events']} events: p50 {r['p50_s']:.3f} s  p90 {r['p90_s']:.3f} s  "
                  f"p99 {r['p99_s']:.3f} s  max {r['max_s']:.3f} s  (load {load})", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        procs.stop()
        engine.dispose()
        for url in (sink_url, catalog_url):
            drop_pg(DEFAULT_PG, url)


if __name__ == "__main__":
    main()
