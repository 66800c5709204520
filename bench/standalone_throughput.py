"""The same stateful job with its executors on a Spark standalone cluster of 2 workers versus
`local[2]` inside the driver, alternating runs in one benchmark on one machine.

Two Headrace clusters run side by side: L (TaskManager spark_master=local) and S (`--spark-workers
2`, one core each, the TaskManager pointed at that master). An outside Redis holds N events (packed
Arrow entries); every run reads the whole stream with examples/keyed_counts.py --sink sql,
parallelism 2, into a PostgreSQL table of its own. Reported per run:
  start   submission -> first committed batch (driver start, executor allocation on S, first batch)
  steady  events after the first batch / the time from it to the last (sum(count) == N)
The ratio S / L of the steady rates says what running the executors in separate JVMs costs.

usage: python bench/standalone_throughput.py [--events 1000000] [--rounds 2] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs
from bench.checkpoint_overhead import (
    DEFAULT_PG,
    append_entries,
    cycling_keys,
    drop_pg,
    event_entries,
    fresh_pg,
    machine,
    pg_engine,
    watch_sink,
)
from tests.clusters import Rest, start_cluster

ROOT = Path(__file__).resolve().parent.parent
KEYED_COUNTS = ROOT / "examples" / "keyed_counts.py"


def run_once(
    rest: Rest,
    jar: str,
    engine,
    *,
    name: str,
    events: int,
    source: str,
    sink_url: str,
    max_entries: int,
    timeout_s: float,
) -> dict:
    table = f"bench_{name}"
    t_submit = time.monotonic()
    job = rest.run(
        jar,
        parallelism=2,
        jobName=name,
        programArgsList=[
            "--stream",
            "events",
            "--source-url",
            source,
            "--sink",
            "sql",
            "--table",
            table,
            "--sink-url",
            sink_url,
            "--max-entries-per-trigger",
            str(max_entries),
        ],
        flinkConfiguration={"execution.checkpointing.interval": "1 h"},
    )
    try:
        r = watch_sink(engine, table, events, t_submit, timeout_s, poll_s=0.02)
    finally:
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
    return {"start_s": r["first_s"], "steady_s": r["steady_s"], "events_per_s": r["steady_eps"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-entries", type=int, default=100, help="packed entries (1000 events each) per batch")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark still works")
    args = p.parse_args()
    if args.smoke:
        args.events, args.rounds, args.max_entries = 20_000, 1, 10
    home = Path(tempfile.mkdtemp(prefix="hr-standalone-bench-"))
    procs = Procs(home, {})
    sink_url = fresh_pg(DEFAULT_PG)
    # One catalog per cluster: two JobManagers on one catalog would take the leadership from each other.
    catalogs = {"local": fresh_pg(DEFAULT_PG), "standalone": fresh_pg(DEFAULT_PG)}
    engine = pg_engine(sink_url)
    clusters = {}
    try:
        source = procs.redis()
        append_entries(source, "events", event_entries(args.events, keys=cycling_keys(1000), per_entry=1000))
        clusters["local"] = start_cluster(
            home / "local", catalog_url=catalogs["local"], taskmanagers=1, slots=2, restart_strategy={"type": "none"}
        )
        clusters["standalone"] = start_cluster(
            home / "standalone",
            catalog_url=catalogs["standalone"],
            taskmanagers=1,
            slots=2,
            spark_workers=2,
            restart_strategy={"type": "none"},
        )
        rests = {k: Rest(c.dispatcher_url) for k, c in clusters.items()}
        jars = {k: r.upload(KEYED_COUNTS) for k, r in rests.items()}
        print(f"machine: {machine()}; {args.events} events, {args.max_entries} entries per batch, parallelism 2")
        results: dict[str, list[dict]] = {"local": [], "standalone": []}
        for rnd in range(args.rounds):
            for kind in ("local", "standalone"):
                r = run_once(
                    rests[kind],
                    jars[kind],
                    engine,
                    name=f"{kind}_{rnd}",
                    events=args.events,
                    source=source,
                    sink_url=sink_url,
                    max_entries=args.max_entries,
                    timeout_s=600,
                )
                r["load"] = round(os.getloadavg()[0], 2)
                results[kind].append(r)
                print(
                    f"round {rnd + 1} {kind:10s} start {r['start_s']:6.2f} s  steady {r['steady_s']:6.2f} s  "
                    f"{r['events_per_s']:>9,} events/s  (load {r['load']})",
                    flush=True,
                )
        med = {k: statistics.median(x["events_per_s"] for x in v) for k, v in results.items()}
        starts = {k: statistics.median(x["start_s"] for x in v) for k, v in results.items()}
        print(
            f"median events/s: local[2] {med['local']:,.0f}, standalone 2 workers {med['standalone']:,.0f}; "
            f"ratio standalone / local {med['standalone'] / med['local']:.2f}; "
            f"median start: local {starts['local']:.1f} s, standalone {starts['standalone']:.1f} s"
        )
    finally:
        for c in clusters.values():
            c.stop()
        procs.stop()
        engine.dispose()
        for url in (sink_url, *catalogs.values()):
            drop_pg(DEFAULT_PG, url)


if __name__ == "__main__":
    main()
