"""Throughput of one stateful job through Headrace versus the same pipeline on bare PySpark,
alternating in one run on one machine.

An outside redis-server holds N click events (packed Arrow entries of 1000 events, 100 keys, 10,000
events per second of event time). Each run reads the whole stream with
bench/pipelines/click_windows.py (count per key per 10 s tumbling window, watermark 10 s) into a
PostgreSQL table of its own, parallelism 2:
  headrace  submitted over REST (POST /jars/{id}/run) to a local cluster like `headrace up`'s
            (2 TaskManagers with 2 slots each, warm drivers as configured, PostgreSQL catalog);
            before each run every TaskManager has its warm drivers ready
  bare      the same file through bench/bare_spark.py: one python process, a plain SparkSession
            with the TaskManager driver's settings, the same connectors
Runs alternate headrace, bare, headrace, bare, ... PostgreSQL is polled (every 0.1 s) for both:
  total   N / (submission or process start -> sum(count) == N)
  steady  events after the first committed batch / the time from it to the last
and the ratio headrace / bare of the medians of each.

--case just-started (issue 23): no bare runs; each round starts a fresh cluster and submits the
job as soon as it is up (the moment `headrace up` prints "Headrace is up", its warm drivers still
warming), then, on the same cluster once every TaskManager has a ready warm driver, submits it
again: just-started and warm side by side. Besides the figures above, from the task's RUNNING
(the attempt reported RUNNING) to the last event in PostgreSQL.

usage: python bench/throughput.py [--events 10000000] [--rounds 3] [--max-entries 1000] [--smoke]
       python bench/throughput.py --case just-started --events 3000000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs, stop_group
from bench.checkpoint_overhead import (
    BASE_TIME_US,
    DEFAULT_PG,
    append_entries,
    drop_pg,
    fresh_pg,
    machine,
    pg_engine,
    watch_sink,
)
from bench.submit_latency import wait_warm
from services.taskmanager.runtime.connectors.redis_stream_entries import pack_events
from tests.clusters import Rest, start_cluster

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "bench" / "pipelines" / "click_windows.py"
BARE = ROOT / "bench" / "bare_spark.py"
KEYS = 100
EVENTS_PER_EVENT_SECOND = 10_000
CLICK_SCHEMA = pa.schema(
    [("key", pa.string()), ("n", pa.int64()), ("value", pa.int64()), ("event_time", pa.timestamp("us", tz="UTC"))]
)


def click_entries(count: int, per_entry: int = 1000, first: int = 0):
    """Packed entries of clicks numbered first..first+count-1: key = url<n mod 100>, event time
    growing 0.1 ms per event (so nothing is late and 10M events fill 100 windows per key)."""
    names = pa.array([f"/page/{i}" for i in range(KEYS)])
    step_us = 1_000_000 // EVENTS_PER_EVENT_SECOND
    for start in range(first, first + count, per_entry):
        n = np.arange(start, min(start + per_entry, first + count), dtype=np.int64)
        yield pack_events(
            pa.table(
                {
                    "key": names.take(pa.array(n % KEYS)),
                    "n": pa.array(n),
                    "value": pa.array(n % 7),
                    "event_time": pa.array(BASE_TIME_US + n * step_us, type=pa.timestamp("us", tz="UTC")),
                },
                schema=CLICK_SCHEMA,
            )
        )


def pipeline_args(source: str, sink_url: str, table: str, max_entries: int | None) -> list[str]:
    a = ["--stream", "clicks", "--source-url", source, "--sink-url", sink_url, "--table", table]
    return a + (["--max-entries-per-trigger", str(max_entries)] if max_entries else [])


def run_headrace(
    rest: Rest,
    jar: str,
    engine,
    *,
    table: str,
    events: int,
    args: list[str],
    timeout_s: float,
    config: dict | None = None,
) -> dict:
    t0 = time.monotonic()
    job = rest.run(jar, parallelism=2, jobName=table, programArgsList=args, flinkConfiguration=config or {})
    running = RunningWatch(rest.http.base_url, job)
    try:
        r = watch_sink(engine, table, events, t0, timeout_s)
        if running.at is not None:
            r["running_s"] = round(running.at - t0, 2)
            r["from_running_eps"] = round(events / (t0 + r["total_s"] - running.at))
        return r
    finally:
        running.stop()
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)


class RunningWatch:
    """When the job's first attempt is reported RUNNING, watched from a thread of its own."""

    def __init__(self, url, job: str):
        self.at: float | None = None
        self._stop = threading.Event()
        self._rest = Rest(str(url))
        self._job = job
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.at is None and not self._stop.is_set():
            try:
                attempts = self._rest.attempts(self._job)
            except Exception:  # noqa: BLE001 - a slow answer under load: ask again
                attempts = []
            if attempts and attempts[-1]["status"] == "RUNNING":
                self.at = time.monotonic()
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()


def just_started_vs_warm(args, source: str, sink_url: str, engine, home: Path) -> None:
    """--case just-started: see the module docstring. The clusters get a private TMPDIR, so their
    warm-up tokens (services/taskmanager/drivers/warm_pool.py) are not shared with other clusters that may
    run on the machine meanwhile (test suites); the CPU stays shared."""
    (home / "tmp").mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(home / "tmp")  # the clusters' children inherit it
    print(
        f"machine: {machine()}; {args.events:,} events, max entries per trigger {args.max_entries}, "
        f"parallelism 2, warm drivers {args.warm}; a fresh cluster per round",
        flush=True,
    )
    results: dict[str, list[dict]] = {"just-started": [], "warm": []}
    for rnd in range(args.rounds):
        catalog_url = fresh_pg(DEFAULT_PG)
        cluster = None
        try:
            cluster = start_cluster(
                home / f"cluster-{rnd}",
                catalog_url=catalog_url,
                taskmanagers=2,
                slots=2,
                warm_drivers=args.warm,
                restart_strategy={"type": "none"},
            )
            rest = Rest(cluster.dispatcher_url)
            jar = rest.upload(PIPELINE)
            for kind in ("just-started", "warm"):
                if kind == "warm":
                    wait_warm(cluster, args.warm)
                table = f"{kind.replace('-', '_')}_{rnd}"
                load = round(os.getloadavg()[0], 2)
                r = run_headrace(
                    rest,
                    jar,
                    engine,
                    table=table,
                    events=args.events,
                    args=pipeline_args(source, sink_url, table, args.max_entries),
                    timeout_s=args.timeout,
                )
                r["load"] = load
                results[kind].append(r)
                print(
                    f"round {rnd + 1} {kind:12s} RUNNING after {r.get('running_s', float('nan')):6.2f} s  "
                    f"first batch {r['first_s']:6.2f} s  all {r['total_s']:6.2f} s  "
                    f"from RUNNING {r.get('from_running_eps', 0):>9,} ev/s  total {r['total_eps']:>9,} ev/s  "
                    f"steady {r['steady_eps'] or 0:>9,} ev/s  (load {load})",
                    flush=True,
                )
        finally:
            if cluster is not None:
                cluster.stop()
            drop_pg(DEFAULT_PG, catalog_url)
    print(
        "| case | RUNNING after submit | first batch | all | events/s from RUNNING | events/s whole run | "
        "steady events/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, rs in results.items():
        print(
            f"| {kind} (median of {len(rs)}) | {median_of(rs, 'running_s'):.2f} s | {median_of(rs, 'first_s'):.2f} s "
            f"| {median_of(rs, 'total_s'):.2f} s | {median_of(rs, 'from_running_eps'):,.0f} "
            f"| {median_of(rs, 'total_eps'):,.0f} | {median_of(rs, 'steady_eps'):,.0f} |"
        )
    warm, started = (median_of(results[k], "from_running_eps") for k in ("warm", "just-started"))
    print(f"just-started / warm, from RUNNING: {started / max(1, warm):.2f}")


def median_of(results: list[dict], key: str) -> float:
    return statistics.median(r.get(key) or 0 for r in results)


def start_bare(
    home: Path,
    *,
    table: str,
    args: list[str],
    shuffle_partitions: int,
    driver_memory: str,
    conf: dict[str, str] | None = None,
) -> subprocess.Popen:
    """bench/bare_spark.py running PIPELINE in its own process group (stop it with stop_bare)."""
    (home / "logs").mkdir(parents=True, exist_ok=True)
    confs = [a for k, v in (conf or {}).items() for a in ("--conf", f"{k}={v}")]
    cmd = [
        sys.executable,
        str(BARE),
        "--parallelism",
        "2",
        "--checkpoint",
        str(home / "bare-checkpoints" / table),
        "--shuffle-partitions",
        str(shuffle_partitions),
        "--driver-memory",
        driver_memory,
        *confs,
        str(PIPELINE),
        "--",
        *args,
    ]
    with open(home / "logs" / f"{table}.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_bare(
    home: Path,
    engine,
    *,
    table: str,
    events: int,
    args: list[str],
    timeout_s: float,
    shuffle_partitions: int,
    driver_memory: str,
) -> dict:
    t0 = time.monotonic()
    proc = start_bare(home, table=table, args=args, shuffle_partitions=shuffle_partitions, driver_memory=driver_memory)
    try:
        return watch_sink(engine, table, events, t0, timeout_s, alive=lambda: proc.poll() is None)
    finally:
        stop_group(proc)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--max-entries",
        type=int,
        default=1000,
        help="max_entries_per_trigger: packed entries of 1000 events per micro-batch (0: the "
        "connector's default, all that is available)",
    )
    p.add_argument("--warm", type=int, default=1, help="warm drivers per TaskManager (HEADRACE_WARM_DRIVERS)")
    p.add_argument("--warm-parallelism", type=int, default=None, help="HEADRACE_WARM_PARALLELISM")
    p.add_argument("--only", choices=("headrace", "bare"), default=None)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark still works")
    p.add_argument("--latency-mode", action="store_true", help="Headrace's jobs with headrace.latency-mode")
    p.add_argument(
        "--case",
        choices=("bare", "just-started"),
        default="bare",
        help="bare: Headrace against bare PySpark on a warm cluster; just-started: a cluster just up "
        "against the same cluster warm",
    )
    args = p.parse_args()
    if args.smoke:
        args.events, args.rounds, args.max_entries = 50_000, 1, 20
    home = Path(tempfile.mkdtemp(prefix="hr-throughput-"))
    procs = Procs(home, {})
    sink_url, catalog_url = fresh_pg(DEFAULT_PG), fresh_pg(DEFAULT_PG)
    engine = pg_engine(sink_url)
    cluster = None
    try:
        source = procs.redis()
        t = time.monotonic()
        append_entries(source, "clicks", click_entries(args.events))
        print(f"preloaded {args.events:,} events in {time.monotonic() - t:.1f} s", flush=True)
        if args.case == "just-started":
            just_started_vs_warm(args, source, sink_url, engine, home)
            return
        extra = {} if args.warm_parallelism is None else {"warm_parallelism": args.warm_parallelism}
        cluster = start_cluster(
            home / "cluster",
            catalog_url=catalog_url,
            taskmanagers=2,
            slots=2,
            warm_drivers=args.warm,
            restart_strategy={"type": "none"},
            **extra,
        )
        settings = cluster.settings
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(PIPELINE)
        print(
            f"machine: {machine()}; {args.events:,} events, max entries per trigger {args.max_entries}, "
            f"parallelism 2, warm drivers {args.warm}",
            flush=True,
        )
        kinds = [args.only] if args.only else ["headrace", "bare"]
        results: dict[str, list[dict]] = {k: [] for k in kinds}
        for rnd in range(args.rounds):
            for kind in kinds:
                table = f"{kind}_{rnd}"
                pargs = pipeline_args(source, sink_url, table, args.max_entries)
                if kind == "headrace":
                    if args.warm:
                        wait_warm(cluster, args.warm)
                    load = round(os.getloadavg()[0], 2)
                    r = run_headrace(
                        rest,
                        jar,
                        engine,
                        table=table,
                        events=args.events,
                        args=pargs,
                        timeout_s=args.timeout,
                        config={"headrace.latency-mode": True} if args.latency_mode else None,
                    )
                else:
                    load = round(os.getloadavg()[0], 2)
                    r = run_bare(
                        home,
                        engine,
                        table=table,
                        events=args.events,
                        args=pargs,
                        timeout_s=args.timeout,
                        shuffle_partitions=settings.spark_shuffle_partitions,
                        driver_memory=settings.driver_memory,
                    )
                r["load"] = load
                results[kind].append(r)
                print(
                    f"round {rnd + 1} {kind:8s} first batch {r['first_s']:6.2f} s  all {r['total_s']:6.2f} s  "
                    f"total {r['total_eps']:>9,} ev/s  steady {r['steady_eps'] or 0:>9,} ev/s  "
                    f"{r['batches']} batches  (load {load})",
                    flush=True,
                )
        med = {
            k: {m: statistics.median(x[m] or 0 for x in v) for m in ("total_eps", "steady_eps", "first_s")}
            for k, v in results.items()
        }
        for k, m in med.items():
            print(
                f"median {k:8s}: total {m['total_eps']:,.0f} ev/s, steady {m['steady_eps']:,.0f} ev/s, "
                f"first batch after {m['first_s']:.2f} s"
            )
        if len(med) == 2:
            print(
                f"ratio headrace / bare: total {med['headrace']['total_eps'] / med['bare']['total_eps']:.2f}, "
                f"steady {med['headrace']['steady_eps'] / max(1, med['bare']['steady_eps']):.2f}"
            )
    finally:
        if cluster is not None:
            cluster.stop()
        procs.stop()
        engine.dispose()
        for url in (sink_url, catalog_url):
            drop_pg(DEFAULT_PG, url)


if __name__ == "__main__":
    main()
