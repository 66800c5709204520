"""End-to-end latency of a trickle: an event written to a Redis stream -> its count committed in
PostgreSQL, through Headrace and through the same pipeline on bare PySpark, one after the other
in one run.

A producer thread XADDs single JSON events (what outside producers write) at --rate events/s,
noting each event's number and the time it was written. bench/pipelines/click_windows.py counts
them per key per 10 s window (with the default trigger, or --trigger) and upserts the counts
with the highest event number of each window (`last_n`). A watcher polls the sink every
--poll-ms for max(last_n): batches commit a prefix of the stream, so every event up to that
number is committed by then. An event's latency = the first poll that saw it committed - the
time it was written (the poll adds up to --poll-ms). The first --warmup-s of each run are left
out (the query's first batches); then --duration-s of events are measured: p50, p90, p99, max.

Four runs, one after the other (--rounds N alternates them): *headrace*, submitted over REST to a
warm cluster like `headrace up`'s; *headrace-latency*, the same with the job option
headrace.latency-mode; *bare*, the file through bench/bare_spark.py, a plain SparkSession; and
*bare-tuned*, a plain session with the Spark settings the latency mode runs with (which tells
Spark's part from the control plane's).

usage: python bench/latency.py [--duration-s 60] [--rate 100] [--trigger "200 milliseconds"]
       [--kinds headrace,headrace-latency,bare,bare-tuned] [--rounds 1] [--smoke]
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
from shared.job_options import LATENCY_MODE
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
            event = {
                "key": f"/page/{n % KEYS}",
                "n": n,
                "value": 1,
                "event_time": dt.datetime.now(dt.timezone.utc).isoformat(),
            }
            self.client.xadd(self.stream, {"json": json.dumps(event)})
            self.written[n] = time.monotonic()


def committed_n(engine: sa.Engine, table: str) -> int:
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text(f'SELECT coalesce(max(last_n), -1) FROM "{table}"')).scalar())
    except sa.exc.ProgrammingError:
        return -1  # no batch has created the table yet


def measure(
    engine: sa.Engine,
    table: str,
    source: str,
    stream: str,
    *,
    rate: float,
    warmup_s: float,
    duration_s: float,
    poll_s: float,
    alive=lambda: True,
) -> dict:
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
    return {
        "events": len(lat),
        "p50_s": round(percentile(lat, 0.5), 3),
        "p90_s": round(percentile(lat, 0.9), 3),
        "p99_s": round(percentile(lat, 0.99), 3),
        "max_s": round(max(lat), 3),
    }


KINDS = ("headrace", "headrace-latency", "bare", "bare-tuned")


def bare_conf(kind: str) -> tuple[dict[str, str], int]:
    """Spark options and state partitions of a bare run: a plain session's, or (bare-tuned) the
    ones a Headrace driver in the latency mode runs with, to tell Spark's part from ours."""
    if kind == "bare-tuned":
        from services.taskmanager.runtime.spark_session import CHECKPOINT_FILE_MANAGER
        from shared.job_options import LATENCY_STATE_PARTITIONS

        return (
            {
                "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
                "spark.python.unix.domain.socket.enabled": "true",
            },
            LATENCY_STATE_PARTITIONS,
        )
    return {}, 0


def run_headrace(
    kind: str, cluster, rest: Rest, jar: str, engine, pargs: list[str], source: str, stream: str, args
) -> dict:
    config = {LATENCY_MODE: "true"} if kind == "headrace-latency" else {}
    wait_warm(cluster, 1)
    job = rest.run(jar, parallelism=2, jobName=kind, programArgsList=pargs, flinkConfiguration=config)
    try:
        rest.wait_running_task(job, timeout_s=120)
        return measure(
            engine,
            stream,
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


def run_bare(kind: str, home: Path, engine, pargs: list[str], source: str, stream: str, settings, args) -> dict:
    conf, partitions = bare_conf(kind)
    proc = start_bare(
        home,
        table=stream,
        args=pargs,
        driver_memory=settings.driver_memory,
        conf=conf,
        shuffle_partitions=partitions or settings.spark_shuffle_partitions,
    )
    try:
        # The producer starts once the query runs, as it does for Headrace.
        log = home / "logs" / f"{stream}.log"
        deadline = time.monotonic() + 180
        while "bare: query started" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the bare query did not start; see {log}")
            time.sleep(0.2)
        return measure(
            engine,
            stream,
            source,
            stream,
            rate=args.rate,
            warmup_s=args.warmup_s,
            duration_s=args.duration_s,
            poll_s=args.poll_ms / 1000,
            alive=lambda: proc.poll() is None,
        )
    finally:
        stop_group(proc)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--duration-s", type=float, default=60)
    p.add_argument("--warmup-s", type=float, default=15)
    p.add_argument("--rate", type=float, default=100)
    p.add_argument(
        "--trigger",
        default=None,
        help="a processing-time trigger for the pipeline (default: none, the next micro-batch at once)",
    )
    p.add_argument("--poll-ms", type=float, default=20)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"which runs, in order: {', '.join(KINDS)}")
    p.add_argument("--rounds", type=int, default=1, help="run every kind this many times, alternating")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark still works")
    args = p.parse_args()
    kinds = args.kinds.split(",")
    if any(k not in KINDS for k in kinds):
        raise SystemExit(f"--kinds: choose from {', '.join(KINDS)}")
    if args.smoke:
        args.duration_s, args.warmup_s, kinds = 5, 5, ["headrace-latency"]
    home = Path(tempfile.mkdtemp(prefix="hr-latency-"))
    procs = Procs(home, {})
    sink_url, catalog_url = fresh_pg(DEFAULT_PG), fresh_pg(DEFAULT_PG)
    engine = pg_engine(sink_url)
    cluster = None
    results: dict[str, list[dict]] = {}
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
        print(
            f"machine: {machine()}; {args.rate:g} events/s, trigger {args.trigger or 'none (at once)'}, "
            f"{args.duration_s:g} s measured after {args.warmup_s:g} s",
            flush=True,
        )
        for run in range(args.rounds):
            for kind in kinds:
                stream = f"{kind.replace('-', '_')}_{run}"
                pargs = ["--stream", stream, "--source-url", source, "--sink-url", sink_url, "--table", stream]
                if args.trigger:
                    pargs += ["--trigger", args.trigger]
                load = round(os.getloadavg()[0], 2)
                if kind.startswith("headrace"):
                    r = run_headrace(kind, cluster, rest, jar, engine, pargs, source, stream, args)
                else:
                    r = run_bare(kind, home, engine, pargs, source, stream, cluster.settings, args)
                r["load"] = load
                results.setdefault(kind, []).append(r)
                print(
                    f"{kind:16s} {r['events']} events: p50 {r['p50_s']:.3f} s  p90 {r['p90_s']:.3f} s  "
                    f"p99 {r['p99_s']:.3f} s  max {r['max_s']:.3f} s  (load {load})",
                    flush=True,
                )
        print(json.dumps(results))
    finally:
        if cluster is not None:
            cluster.stop()
        procs.stop()
        engine.dispose()
        for url in (sink_url, catalog_url):
            drop_pg(DEFAULT_PG, url)


if __name__ == "__main__":
    main()
