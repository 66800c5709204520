"""Where a job's first minute stalls: latency second by second from its first committed event,
beside what the cluster's logs say happened meanwhile.

The check a user makes (issue 42.7): a fresh cluster like `headrace up`'s, the counting job
(bench/pipelines/click_windows.py, a Redis stream into PostgreSQL) submitted as soon as every
TaskManager has a ready warm driver, 100 events/s, measured from the first event seen in the sink
with no warm-up left out. bench/latency.py's producer and watcher; an event's latency = the
first poll that saw it committed - when it was written. Prints p50/p99/max over the whole minute,
then the same for the events written after the first one was in the sink (those that waited for
micro-batches only, not for the job's start), then each second whose slowest event waited over
--stall-s, and the log lines of the cluster (checkpoints, warm drivers starting and ready, the
task's phases) within a few seconds of them.

usage: python bench/latency_timeline.py [--duration-s 60] [--rate 100] [--stall-s 1.0] [--latency-mode]
                                         [--no-warm-planner]
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs
from bench.checkpoint_overhead import machine, percentile, throwaway_databases
from bench.latency import Producer, committed_n
from bench.submit_latency import wait_warm
from bench.throughput import PIPELINE
from shared.job_options import LATENCY_MODE
from tests.clusters import Rest, start_cluster

# Log lines worth seeing beside a stall (the services' logs and the drivers').
NOTABLE = re.compile(
    r"checkpoint \d+ .*completed|warm driver|warm-up|task phase|restart|GC|gave up|waiting|planner", re.I
)
LOG_TIMES = (
    (re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"), "%Y-%m-%d %H:%M:%S,%f"),  # the services'
    (re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d)"), "%y/%m/%d %H:%M:%S"),
)  # Spark's, in drivers' logs


def series(engine, table: str, producer: Producer, total: int, poll_s: float, deadline: float) -> dict[int, float]:
    """Wall-clock time each event was first seen committed."""
    seen: dict[int, float] = {}
    last = -1
    while last < total - 1 and time.monotonic() < deadline:
        n = committed_n(engine, table)
        now = time.time()
        for k in range(last + 1, n + 1):
            seen[k] = now
        last = max(last, n)
        time.sleep(poll_s)
    return seen


def log_lines(root: Path) -> list[tuple[float, str, str]]:
    """(epoch seconds, file, line) of the notable lines of every log under root."""
    out = []
    for path in root.rglob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if not NOTABLE.search(line):
                continue
            for pattern, form in LOG_TIMES:
                if m := pattern.match(line):
                    at = dt.datetime.strptime(m.group(1), form).timestamp()
                    out.append((at, path.name, line[len(m.group(1)) :].strip()[:160]))
                    break
    return sorted(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--duration-s", type=float, default=60)
    p.add_argument("--rate", type=float, default=100)
    p.add_argument("--stall-s", type=float, default=1.0)
    p.add_argument("--poll-ms", type=float, default=20)
    p.add_argument("--latency-mode", action="store_true")
    p.add_argument(
        "--no-warm-planner",
        action="store_true",
        help="the dispatcher keeps no spare restore-check planner (whose JVM warms up in the first minute)",
    )
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hr-latency-timeline-"))
    procs = Procs(home, {})
    with throwaway_databases() as (sink_url, catalog_url, engine):
        try:
            run(args, home, procs, sink_url, catalog_url, engine)
        finally:
            procs.stop()
            shutil.rmtree(home, ignore_errors=True)


def run(args, home: Path, procs: Procs, sink_url: str, catalog_url: str, engine) -> None:
    cluster = None
    try:
        source = procs.redis()
        cluster = start_cluster(
            home / "cluster",
            catalog_url=catalog_url,
            taskmanagers=2,
            slots=2,
            warm_drivers=1,
            warm_planner=not args.no_warm_planner,
        )
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(PIPELINE)
        wait_warm(cluster, 1)
        stream = "timeline"
        config = {LATENCY_MODE: "true"} if args.latency_mode else {}
        job = rest.run(
            jar,
            parallelism=2,
            jobName=stream,
            flinkConfiguration=config,
            programArgsList=["--stream", stream, "--source-url", source, "--sink-url", sink_url, "--table", stream],
        )
        total = int(args.rate * (args.duration_s + 20))
        producer = Producer(source, stream, args.rate, 0, total)
        producer.start()
        wall0 = time.time() - time.monotonic()  # monotonic -> epoch
        seen = series(engine, stream, producer, total, args.poll_ms / 1000, time.monotonic() + args.duration_s + 140)
        producer.stop.set()
        rest.cancel(job)
        first = min(seen) if seen else None
        if first is None:
            raise SystemExit("no event reached the sink")
        start = seen[first]
        lat = {
            n: seen[n] - (producer.written[n] + wall0)
            for n in seen
            if n in producer.written and seen[n] - start <= args.duration_s
        }
        values = list(lat.values())
        print(
            f"machine: {machine()}; {len(values)} events over {args.duration_s:g} s from the first committed one "
            f"(event {first}); p50 {percentile(values, 0.5):.3f} s, p99 {percentile(values, 0.99):.3f} s, "
            f"max {max(values):.3f} s"
        )
        # The check starts measuring once the first event is in the sink: the events written
        # before that waited for the job's start, not for its micro-batches.
        later = [v for n, v in lat.items() if producer.written[n] + wall0 >= start]
        if later:
            print(
                f"events written after the first one was in the sink: {len(later)}; p50 "
                f"{percentile(later, 0.5):.3f} s, p99 {percentile(later, 0.99):.3f} s, max {max(later):.3f} s"
            )
        by_second: dict[int, float] = {}
        for n, v in lat.items():
            sec = int(seen[n] - start)
            by_second[sec] = max(by_second.get(sec, 0.0), v)
        stalls = [s for s, v in sorted(by_second.items()) if v > args.stall_s]
        print(
            f"seconds (from the first committed event) whose slowest event waited over {args.stall_s:g} s: "
            + (", ".join(f"{s} ({by_second[s]:.2f} s)" for s in stalls) or "none")
        )
        near = [
            (when, name, line)
            for when, name, line in log_lines(home)
            if any(start + s - 4 <= when <= start + s + 1 for s in stalls)
        ]
        for when, name, line in near:
            print(f"  {when - start:+7.2f} s {name}: {line}")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
