"""Throughput cost of periodic checkpoints: the same stateful job with checkpoints every 1 s
(A) and without (B), alternating A, B, A, B, ... in one run on one cluster.

The job is examples/keyed_counts.py --sink sql (running count and sum per key, upserted into
PostgreSQL by key). Before the first run the cluster's Redis holds a stream of N events (packed
Arrow entries of ~1000 events, `keys` distinct keys); every run reads the whole stream from the
start into a table of its own, `max_entries_per_trigger` entries per micro-batch, so a run has
many batches and a checkpoint lands between most of them. The clock starts at the first
committed batch (the sink's table first has rows: Spark's slow first batch is left out) and stops
when the sink's sum(count) equals N; throughput = events after the first batch / that time.
PostgreSQL is polled for both ends, so they share one clock and one path.

Before each measured run: both TaskManagers have a warm driver ready (no JVM starting in the
background during a run) and the 1-minute load average is below --max-load (other work on the
machine), waited for up to --load-wait s; the load is printed with each figure.

usage: python bench/checkpoint_overhead.py [--events 2000000] [--rounds 2] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sink_db import sink_db_url
from bench.submit_latency import wait_warm
from services.jobmanager.checkpoint_coordinator import ABORTED_BY_TASK_END
from services.taskmanager.runtime.connectors.redis_stream_entries import pack_events
from shared import checkpoint_storage
from shared.catalog.models import CheckpointRow
from tests.clusters import Rest, start_cluster

ROOT = Path(__file__).resolve().parent.parent
KEYED_COUNTS = ROOT / "examples" / "keyed_counts.py"
DEFAULT_PG = os.environ.get("HEADRACE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
EVENT_SCHEMA = pa.schema(
    [("key", pa.string()), ("n", pa.int64()), ("value", pa.int64()), ("event_time", pa.timestamp("us", tz="UTC"))]
)
BASE_TIME_US = int(dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc).timestamp() * 1_000_000)
PIPELINE_DEPTH = 100  # XADDs per round trip while preloading
# A declined checkpoint must not fail the job over in the middle of a measurement (the default
# tolerates none): declines are counted and reported instead. See docs/benchmarks.md.
TOLERATE_DECLINES = {"execution.checkpointing.tolerable-failed-checkpoints": 1000}


# ---------------------------------------------------------------- machine and numbers


def wait_quiet(max_load: float, wait_s: float, echo: Callable[[str], None] = print) -> float:
    """Wait until the 1-minute load average is below `max_load` (other work on the machine would
    show up as checkpoint cost). Returns the load when it is, or when `wait_s` ran out: the figure
    is then taken on a busy machine, and the load printed with it says so."""
    deadline = time.monotonic() + wait_s
    load = os.getloadavg()[0]
    said = False
    while load >= max_load and time.monotonic() < deadline:
        if not said:
            echo(f"  load {load:.2f} >= {max_load}: waiting up to {wait_s:.0f} s for a quiet machine")
            said = True
        time.sleep(5)
        load = os.getloadavg()[0]
    if load >= max_load:
        echo(f"  load still {load:.2f} after {wait_s:.0f} s: measuring anyway (figure marked busy)")
    return round(load, 2)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1): p99 of fewer than 100 values is their maximum."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, int(np.ceil(q * len(ordered))))
    return ordered[rank - 1]


def machine() -> dict:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "nproc": os.cpu_count(),
        "memory_gb": round(mem / 2**30, 1),
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


# ---------------------------------------------------------------- data


def event_entries(
    count: int, *, keys: Callable[[np.ndarray], pa.Array], per_entry: int, first: int = 0, seed: int = 7
) -> Iterator[bytes]:
    """Packed entries of `count` events numbered from `first` (keyed_counts' schema); `keys` maps
    event numbers to the key column."""
    rng = np.random.default_rng(seed + first)
    for start in range(first, first + count, per_entry):
        n = np.arange(start, min(start + per_entry, first + count), dtype=np.int64)
        table = pa.table(
            {
                "key": keys(n),
                "n": pa.array(n),
                "value": pa.array(rng.integers(0, 1000, len(n), dtype=np.int64)),
                "event_time": pa.array(BASE_TIME_US + n * 1000, type=pa.timestamp("us", tz="UTC")),
            },
            schema=EVENT_SCHEMA,
        )
        yield pack_events(table)


def cycling_keys(distinct: int) -> Callable[[np.ndarray], pa.Array]:
    names = pa.array([f"k{i}" for i in range(distinct)])
    return lambda n: names.take(pa.array(n % distinct))


def append_entries(redis_url: str, stream: str, entries: Iterator[bytes]) -> int:
    """XADD every entry (pipelined); returns how many."""
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    done = 0
    for blob in entries:
        pipe.xadd(stream, {"arrow": blob})
        done += 1
        if done % PIPELINE_DEPTH == 0:
            pipe.execute()
    pipe.execute()
    client.close()
    return done


# ---------------------------------------------------------------- PostgreSQL sink database


def fresh_pg(admin_url: str) -> str:
    import psycopg

    name = f"headrace_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_pg(admin_url: str, url: str) -> None:
    """The throwaway sink database goes when the run ends: repeated runs must not pile them up."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def pg_engine(url: str) -> sa.Engine:
    return sa.create_engine("postgresql+psycopg://" + url.split("://", 1)[1], pool_size=1)


@contextlib.contextmanager
def throwaway_databases() -> Iterator[tuple[str, str, sa.Engine]]:
    """(sink URL, catalog URL, an engine on the sink): two fresh PostgreSQL databases, dropped
    when the run ends."""
    sink_url, catalog_url = fresh_pg(DEFAULT_PG), fresh_pg(DEFAULT_PG)
    engine = pg_engine(sink_url)
    try:
        yield sink_url, catalog_url, engine
    finally:
        engine.dispose()
        for url in (sink_url, catalog_url):
            drop_pg(DEFAULT_PG, url)


def sink_sum(engine: sa.Engine, table: str) -> int | None:
    """sum(count) of the sink table; None while the sink has not created it (no batch yet)."""
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text(f'SELECT coalesce(sum("count"), 0) FROM "{table}"')).scalar())
    except sa.exc.ProgrammingError:
        return None


def sink_batches(engine: sa.Engine, table: str) -> int:
    with engine.connect() as c:
        return int(
            c.execute(
                sa.text("SELECT count(*) FROM _headrace_sink_commits WHERE sink_id LIKE :s"), {"s": f"%:{table}"}
            ).scalar()
        )


def watch_sink(
    engine: sa.Engine, table: str, events: int, t0: float, timeout_s: float, alive=lambda: True, poll_s: float = 0.1
) -> dict:
    """Poll the sink until sum(count) == `events` (exactly: more fails the run) and time it from
    `t0`: the first committed batch, the last, and the rates over the whole run and after the
    first batch (steady). `alive()` False ends the wait early, as a failure."""
    t_first = s_first = None
    deadline = t0 + timeout_s
    while True:
        total = sink_sum(engine, table)
        now = time.monotonic()
        if total and t_first is None:
            t_first, s_first = now, total
        if total is not None and total >= events:
            break
        if now > deadline:
            raise SystemExit(f"{table}: {total} of {events} events after {timeout_s:.0f} s")
        if not alive():
            raise SystemExit(f"{table}: the run ended with {total} of {events} events in the sink")
        time.sleep(poll_s)
    if total != events:
        raise SystemExit(f"{table}: the sink counted {total} events, not {events}")
    steady = now - t_first
    return {
        "first_s": round(t_first - t0, 2),
        "total_s": round(now - t0, 2),
        "steady_s": round(steady, 2),
        "total_eps": round(events / (now - t0)),
        "steady_eps": round((events - s_first) / steady) if steady > 0 else None,
        "batches": sink_batches(engine, table),
    }


# ---------------------------------------------------------------- checkpoints of a job


def checkpoint_rows(catalog_url: str, job_id: str) -> list[CheckpointRow]:
    """Every checkpoint row of the job, oldest first. A plain read: the Catalog class would take
    SQLite's write lock (BEGIN IMMEDIATE) from under the JobManager."""
    engine = sa.create_engine(catalog_url)
    try:
        with Session(engine) as s:
            return list(
                s.execute(
                    sa.select(CheckpointRow).where(CheckpointRow.job_id == job_id).order_by(CheckpointRow.checkpoint_id)
                ).scalars()
            )
    finally:
        engine.dispose()


def utc_epoch(value: dt.datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()


def checkpoint_summary(
    rows: list[CheckpointRow], *, kind: str = "checkpoint", since: float | None = None, until: float | None = None
) -> dict:
    """Counts and durations of the job's snapshots of `kind` triggered within [since, until]
    (epoch seconds). `driver_ms` is the duration the driver reports (request received ->
    snapshot on disk, including the wait for the barrier batch to commit), `trigger_to_ack_ms`
    the coordinator's (trigger written -> acknowledgement handled)."""

    def inside(r: CheckpointRow) -> bool:
        t = utc_epoch(r.trigger_at)
        return (since is None or t >= since) and (until is None or t <= until)

    mine = [r for r in rows if r.kind == kind and inside(r)]
    done = [r for r in mine if r.status in ("COMPLETED", "DISCARDED")]
    driver = [float(r.duration_ms) for r in done if r.duration_ms is not None]
    e2e = [round((utc_epoch(r.ack_at) - utc_epoch(r.trigger_at)) * 1000) for r in done if r.ack_at]
    sizes = [int(r.state_size or 0) for r in done]

    def pcts(v: list[float]) -> dict:
        return {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "max": max(v) if v else None}

    failed = [r for r in mine if r.status == "FAILED"]
    # The benchmark cancels each job: the checkpoint pending then is aborted, not a failure.
    aborted = [r for r in failed if (r.failure_cause or "").startswith(ABORTED_BY_TASK_END)]
    failed = [r for r in failed if r not in aborted]
    return {
        "completed": len(done),
        "failed": len(failed),
        "aborted_by_cancel": len(aborted),
        "failure_causes": sorted({(r.failure_cause or "?")[:200] for r in failed}),
        "driver_ms": pcts(driver),
        "trigger_to_ack_ms": pcts(e2e),
        "state_size_bytes": {"last": sizes[-1] if sizes else None, "max": max(sizes) if sizes else None},
    }


def snapshot_copy_ms(location: str, scratch: Path) -> int:
    """What a checkpoint does once its barrier batch committed, timed alone: take_snapshot of
    the snapshot's Spark checkpoint (the same files a checkpoint of that batch selects, walks,
    hard-links or copies) into a scratch directory."""
    meta = checkpoint_storage.read_metadata(location)
    src = checkpoint_storage.resolve_snapshot(location) / checkpoint_storage.SPARK_DIR
    target = scratch / "copy"
    t = time.monotonic()
    checkpoint_storage.take_snapshot(src, target, batch_id=meta["spark"]["batch_id"], metadata={})
    took = time.monotonic() - t
    shutil.rmtree(target, ignore_errors=True)
    return round(took * 1000)


# ---------------------------------------------------------------- one run


def measure_run(
    rest: Rest,
    engine: sa.Engine,
    jar: str,
    *,
    run: int,
    interval: str,
    events: int,
    stream: str,
    sink_url: str,
    max_entries: int,
    timeout_s: float,
) -> dict:
    table = f"bench_ckpt_{run}"
    job = rest.run(
        jar,
        parallelism=1,
        jobName=f"ckpt-overhead-{run}",
        programArgsList=[
            "--stream",
            stream,
            "--sink",
            "sql",
            "--table",
            table,
            "--sink-url",
            sink_url,
            "--max-entries-per-trigger",
            str(max_entries),
        ],
        flinkConfiguration={"execution.checkpointing.interval": interval, **TOLERATE_DECLINES},
    )
    deadline = time.monotonic() + timeout_s
    t0 = s0 = None
    polls = 0
    try:
        while True:
            total = sink_sum(engine, table)
            now = time.monotonic()
            if total and t0 is None:
                t0, s0, wall0 = now, total, time.time()
            if total is not None and total >= events:
                break
            if now > deadline:
                raise SystemExit(f"run {run}: sink reached {total} of {events} events within {timeout_s:.0f} s")
            polls += 1
            if polls % 50 == 0:
                state = rest.job(job)["state"]
                if state in ("FAILED", "CANCELED", "FINISHED"):
                    raise SystemExit(f"run {run}: job {job} ended {state} with {total} of {events} events in the sink")
            time.sleep(0.02)
        if total > events:
            raise SystemExit(f"run {run}: sink sum(count) {total} > {events}: events counted twice")
        elapsed = now - t0
        wall1 = time.time()
    finally:
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
    return {
        "job": job,
        "table": table,
        "seconds": round(elapsed, 2),
        "events_timed": events - s0,
        "events_per_s": round((events - s0) / elapsed) if elapsed > 0 else None,
        "batches": sink_batches(engine, table),
        "window": (wall0, wall1),
    }


def main() -> None:
    # SIGTERM must run the `finally` below, or the benchmark's services outlive it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=1000, help="distinct keys")
    ap.add_argument("--events-per-entry", type=int, default=1000)
    ap.add_argument(
        "--max-entries-per-trigger",
        type=int,
        default=40,
        help="stream entries per micro-batch (40 x 1000 events: ~50 batches for 2M)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs (A: checkpoints, B: none)")
    ap.add_argument("--interval", default="1 s", help="checkpoint interval of the A runs")
    ap.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL admin URL; a throwaway database is created")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--load-wait", type=float, default=300, help="seconds to wait for the load to drop")
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one round, no waiting for quiet")
    ap.add_argument(
        "--keep", action="store_true", help="keep the temporary home (logs, checkpoints); kept anyway after a failure"
    )
    a = ap.parse_args()
    if a.smoke:
        a.events, a.rounds, a.max_entries_per_trigger, a.load_wait = 20_000, 1, 4, 0
    home = Path(tempfile.mkdtemp(prefix="headrace-ckpt-overhead-"))
    print(f"home {home}", file=sys.stderr)
    sink_url = fresh_pg(a.pg)
    engine = pg_engine(sink_url)
    catalog = f"sqlite:///{home / 'catalog.db'}"
    cluster = None
    ok = False
    result: dict = {
        "machine": machine(),
        "events": a.events,
        "keys": a.keys,
        "events_per_entry": a.events_per_entry,
        "max_entries_per_trigger": a.max_entries_per_trigger,
        "interval": a.interval,
        "runs": [],
    }
    try:
        cluster = start_cluster(
            home, catalog_url=catalog, taskmanagers=2, slots=2, warm_drivers=1, pipeline_catalog_url=sink_db_url(home)
        )
        rest = Rest(cluster.dispatcher_url)
        t = time.monotonic()
        entries = append_entries(
            cluster.redis_url,
            "events",
            event_entries(a.events, keys=cycling_keys(a.keys), per_entry=a.events_per_entry),
        )
        print(f"preloaded {a.events} events in {entries} entries in {time.monotonic() - t:.1f} s", file=sys.stderr)
        jar = rest.upload(KEYED_COUNTS)
        variants = [("A", a.interval), ("B", "0")]
        for run in range(2 * a.rounds):
            name, interval = variants[run % 2]
            wait_warm(cluster, 1)
            load = wait_quiet(a.max_load, a.load_wait, echo=lambda m: print(m, file=sys.stderr))
            r = measure_run(
                rest,
                engine,
                jar,
                run=run,
                interval=interval,
                events=a.events,
                stream="events",
                sink_url=sink_url,
                max_entries=a.max_entries_per_trigger,
                timeout_s=a.run_timeout,
            )
            r.update(variant=name, interval=interval, load=load, load_after=round(os.getloadavg()[0], 2))
            if name == "A":
                rows = checkpoint_rows(catalog, r["job"])
                # Those triggered while the clock ran are the ones that could cost throughput;
                # the first one usually waits for Spark's slow first batch.
                r["checkpoints"] = checkpoint_summary(rows, since=r["window"][0], until=r["window"][1])
                r["checkpoints_whole_job"] = checkpoint_summary(rows)
                kept = [row for row in rows if row.status == "COMPLETED" and row.kind == "checkpoint" and row.path]
                if kept:
                    r["checkpoints"]["copy_alone_ms"] = snapshot_copy_ms(kept[-1].path, home / "scratch")
            r.pop("window")
            result["runs"].append(r)
            ck = r.get("checkpoints")
            print(
                f"run {run} {name} ({interval}): {r['events_per_s']} events/s, {r['seconds']} s, {r['batches']} "
                f"batches, load {load} -> {r['load_after']}"
                + (
                    f", {ck['completed']} checkpoints, driver p50 {ck['driver_ms']['p50']} ms, copy alone "
                    f"{ck.get('copy_alone_ms')} ms"
                    if ck
                    else ""
                ),
                file=sys.stderr,
            )
        a_rates = [r["events_per_s"] for r in result["runs"] if r["variant"] == "A"]
        b_rates = [r["events_per_s"] for r in result["runs"] if r["variant"] == "B"]
        result["median_events_per_s"] = {"A": statistics.median(a_rates), "B": statistics.median(b_rates)}
        result["ratio_A_over_B"] = round(statistics.median(a_rates) / statistics.median(b_rates), 3)
        ok = True
    finally:
        if cluster is not None:
            cluster.stop()
        engine.dispose()
        drop_pg(a.pg, sink_url)
        if ok and not a.keep:
            shutil.rmtree(home, ignore_errors=True)
        else:
            print(f"kept {home} (logs under runs/*/logs)", file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
