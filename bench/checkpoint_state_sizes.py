"""Checkpoint, savepoint and restore times against state size (about 10 MB, 100 MB, 1 GB).

For each size, on one warm local cluster (2 TaskManagers, SQLite catalog and sink):
  1. grow: submit bench/pipelines/keyed_state.py (count and sum per key, state kept, nothing
     emitted) with checkpoints every --interval, and feed its Redis stream events whose keys are
     all distinct (--key-bytes long, random, so compression cannot shrink them), in chunks,
     until a completed checkpoint that covers every event fed so far has a state_size (the
     snapshot's bytes, from the acknowledgement) of at least 90 % of the target, or
     --size-timeout runs out (then the largest size reached is measured and reported as such);
  2. checkpoints: while a trickle of updates to existing keys keeps batches coming (an entry of
     --trickle-events events every 0.5 s), wait for --checkpoints more completed checkpoints: their
     duration p50/p99 as the driver reports it (request received -> snapshot on disk, including
     the wait for the barrier batch to commit) and as the coordinator sees it (trigger -> ack);
  3. savepoint: POST /jobs/{id}/savepoints -> GET .../savepoints/{trigger} COMPLETED;
  4. restore: cancel the job, append one entry, submit the same pipeline with that savepoint as
     savepointPath: POST -> its attempt RUNNING (the snapshot restored into the attempt's live
     directory, the query started) and POST -> first committed batch (Spark loads the state).

The HDFS-backed state store (Spark's default) keeps every key on the driver's heap (1 GB, the
cluster's `driver_memory`), several versions of it at once: sizes from --rocksdb-from (100 MB) up use
the RocksDB provider, through the job's configuration (spark.sql.streaming.stateStore.
providerClass, applied by the runner as a spark.sql.* option). --provider forces one.

Before the checkpoint window (the savepoint follows it at once) and before the restore, the
1-minute load average must be below --max-load: the benchmark waits up to --load-wait s for
it, then measures anyway and marks the figure busy in its log; the load is printed (and kept in
the JSON) with each figure. A declined checkpoint does not fail the job over here (it is counted
instead): see TOLERATE_DECLINES in bench/checkpoint_overhead.py.

usage: python bench/checkpoint_state_sizes.py [--sizes 10MB,100MB,1GB] [--smoke]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoint_overhead import (
    TOLERATE_DECLINES,
    append_entries,
    checkpoint_rows,
    checkpoint_summary,
    event_entries,
    machine,
    snapshot_copy_ms,
    wait_quiet,
)
from bench.sink_db import sink_db_url
from bench.submit_latency import wait_warm
from shared import checkpoint_storage
from tests.clusters import Rest, start_cluster

PIPELINE = Path(__file__).resolve().parent / "pipelines" / "keyed_state.py"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER_OPTION = "spark.sql.streaming.stateStore.providerClass"
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}
PER_ENTRY = 1000  # events per stream entry
REACHED = 0.9  # a size counts as reached at 90 % of its target


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B)\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 10MB or 1GB")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def label(size: int) -> str:
    for unit in ("GB", "MB", "KB"):
        if size >= UNITS[unit]:
            return f"{size / UNITS[unit]:g}{unit}"
    return f"{size}B"


def distinct_keys(key_bytes: int, seed: int = 11) -> Callable[[np.ndarray], pa.Array]:
    """Event number -> a key of `key_bytes` characters unique to it: the number, then random
    base64 (incompressible for lz4 and RocksDB's block compression). Deterministic per entry, so
    an entry can be generated again to update the same keys."""
    pad = max(1, key_bytes - 11)

    def keys(n: np.ndarray) -> pa.Array:
        raw = base64.b64encode(np.random.default_rng(seed + int(n[0])).bytes(len(n) * pad)).decode()
        return pa.array([f"{i:010d}-{raw[j * pad : (j + 1) * pad]}" for j, i in enumerate(n.tolist())])

    return keys


class Stream:
    """The job's input: a Redis stream fed with events of distinct keys, numbered from 0."""

    def __init__(self, redis_url: str, name: str, key_bytes: int):
        self.url, self.name = redis_url, name
        self.keys = distinct_keys(key_bytes)
        self.fed = 0
        self.client = redis.Redis.from_url(redis_url)

    def grow(self, events: int) -> None:
        append_entries(self.url, self.name, event_entries(events, keys=self.keys, per_entry=PER_ENTRY, first=self.fed))
        self.fed += events

    def repeat(self, entry: int, events: int) -> None:
        """`events` existing keys (the start of the entry-th entry) again: updates, no new state."""
        first = (entry % max(1, self.fed // PER_ENTRY)) * PER_ENTRY
        append_entries(
            self.url,
            self.name,
            event_entries(min(events, PER_ENTRY, self.fed), keys=self.keys, per_entry=PER_ENTRY, first=first),
        )

    def last_id(self) -> str:
        last = self.client.xrevrange(self.name, "+", "-", count=1)
        return last[0][0].decode() if last else "0-0"

    def drop(self) -> None:
        self.client.delete(self.name)
        self.client.close()


class Trickle:
    """Updates of existing keys every `period_s` in a thread, so batches keep coming."""

    def __init__(self, stream: Stream, events: int, period_s: float = 0.5):
        self.stream, self.events, self.period_s = stream, events, period_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trickle", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop_event.wait(self.period_s):
            self.stream.repeat(i, self.events)
            i += 1

    def __enter__(self) -> "Trickle":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(10)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def covering_checkpoint(rest: Rest, job: str, last_id: str, timeout_s: float) -> dict | None:
    """The newest completed checkpoint whose source offset is `last_id` (it holds every event
    fed), waited for up to timeout_s; None if none came."""
    deadline = time.monotonic() + timeout_s
    seen = -1
    while time.monotonic() < deadline:
        latest = rest.get(f"/jobs/{job}/checkpoints")["latest"]["completed"]
        if latest and latest["id"] != seen:
            seen = latest["id"]
            details = rest.get(f"/jobs/{job}/checkpoints/details/{seen}")
            offsets = [json.loads(o).get("id") for o in details.get("source_offsets") or []]
            if last_id in offsets:
                return latest
        state = rest.job(job)["state"]
        if state in ("FAILED", "CANCELED", "FINISHED"):
            raise SystemExit(f"job {job} ended {state} while growing its state; see the TaskManager logs")
        time.sleep(0.5)
    return None


def grow(rest: Rest, job: str, stream: Stream, target: int, deadline: float) -> dict:
    """Feed distinct keys until a covering checkpoint's state_size reaches REACHED * target."""
    chunk = max(PER_ENTRY, (target // 1000) // PER_ENTRY * PER_ENTRY)  # assume <= 1000 B a key: undershoot
    size, ckpt = 0, None
    while True:
        stream.grow(chunk)
        found = covering_checkpoint(rest, job, stream.last_id(), max(0.0, deadline - time.monotonic()))
        if found is None:
            break
        ckpt, size = found, int(found["state_size"])
        log(f"    {stream.fed} keys -> checkpoint {ckpt['id']}: {size / 1e6:.1f} MB")
        if size >= REACHED * target or time.monotonic() >= deadline:
            break
        per_key = max(1.0, size / stream.fed)
        more = (target - size) / per_key
        chunk = max(PER_ENTRY, int(min(more, 4 * stream.fed)) // PER_ENTRY * PER_ENTRY)
    return {
        "keys": stream.fed,
        "state_size_bytes": size,
        "checkpoint": ckpt["id"] if ckpt else None,
        "reached": size >= REACHED * target,
    }


def wait_checkpoints(rest: Rest, job: str, after_id: int, count: int, timeout_s: float) -> int:
    """Wait until `count` checkpoints newer than after_id completed; returns how many did."""
    deadline = time.monotonic() + timeout_s
    done = 0
    while time.monotonic() < deadline:
        latest = rest.get(f"/jobs/{job}/checkpoints")["latest"]["completed"]
        done = (latest["id"] - after_id) if latest else 0
        if done >= count:
            break
        state = rest.job(job)["state"]
        if state != "RUNNING":
            raise SystemExit(f"job {job} is {state} while its checkpoints are measured; see the JobManager log")
        time.sleep(0.5)
    return done


def savepoint(rest: Rest, job: str, target_dir: Path, timeout_s: float) -> tuple[float, str]:
    t0 = time.monotonic()
    r = rest.http.post(f"/jobs/{job}/savepoints", json={"target-directory": str(target_dir), "cancel-job": False})
    r.raise_for_status()
    trigger = r.json()["request-id"]
    deadline = t0 + timeout_s
    while time.monotonic() < deadline:
        body = rest.get(f"/jobs/{job}/savepoints/{trigger}")
        if body["status"]["id"] == "COMPLETED":
            took = time.monotonic() - t0
            op = body["operation"]
            if "location" not in op:
                raise SystemExit(f"savepoint of job {job} failed: {json.dumps(op)[:2000]}")
            return took, op["location"]
        time.sleep(0.05)
    raise SystemExit(f"savepoint of job {job} not COMPLETED within {timeout_s:.0f} s")


def restore(rest: Rest, jar: str, args: list[str], config: dict, location: str, timeout_s: float) -> dict:
    t0 = time.monotonic()
    job = rest.run(
        jar,
        parallelism=1,
        jobName="state-sizes-restored",
        programArgsList=args,
        flinkConfiguration=config,
        savepointPath=location,
    )
    running = batch = None
    deadline = t0 + timeout_s
    try:
        while time.monotonic() < deadline and batch is None:
            attempts = rest.attempts(job)
            if attempts:
                last = attempts[-1]
                if running is None and last["status"] in ("RUNNING", "FINISHED"):
                    running = time.monotonic() - t0
                if last.get("last-batch-id") is not None:
                    batch = time.monotonic() - t0
                    running = running if running is not None else batch
                if last["status"] in ("FAILED", "CANCELED"):
                    raise SystemExit(f"restored job {job} attempt {last['status']}; see the TaskManager logs")
            time.sleep(0.02)
    finally:
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
    if batch is None:
        raise SystemExit(f"restored job {job}: no committed batch within {timeout_s:.0f} s")
    return {"job": job, "post_to_running_s": round(running, 2), "post_to_first_batch_s": round(batch, 2)}


def measure_size(cluster, rest: Rest, jar: str, home: Path, target: int, a: argparse.Namespace) -> dict:
    provider = a.provider if a.provider != "auto" else ("rocksdb" if target >= a.rocksdb_from else "hdfs")
    name = f"state_{label(target)}"
    stream = Stream(cluster.redis_url, name, a.key_bytes)
    args = [
        "--stream",
        name,
        "--table",
        name,
        "--sink-url",
        f"sqlite:///{home / 'sink.db'}",
        "--max-entries-per-trigger",
        str(a.max_entries_per_trigger),
    ]
    config = {
        "execution.checkpointing.interval": a.interval,
        **TOLERATE_DECLINES,
        PROVIDER_OPTION: ROCKSDB if provider == "rocksdb" else HDFS,
    }
    out: dict = {"target": label(target), "target_bytes": target, "provider": provider}
    log(f"{label(target)} ({provider}):")
    wait_warm(cluster, 1)
    job = rest.run(
        jar, parallelism=1, jobName=f"state-sizes-{label(target)}", programArgsList=args, flinkConfiguration=config
    )
    jobs = [job]
    savepoint_dir = home / "savepoints" / name
    try:
        rest.wait_running_task(job, timeout_s=300)
        t = time.monotonic()
        out["grow"] = grow(rest, job, stream, target, deadline=t + a.size_timeout)
        out["grow"]["seconds"] = round(time.monotonic() - t, 1)
        if not out["grow"]["checkpoint"]:
            raise SystemExit(f"{label(target)}: no checkpoint covered the first chunk within {a.size_timeout} s")
        # Waiting for quiet happens before the trickle: updates while waiting would grow the
        # HDFS store's delta files, and with them the state measured.
        out["load_checkpoints"] = wait_quiet(a.max_load, a.load_wait, echo=log)
        with Trickle(stream, a.trickle_events):
            since = rest.get(f"/jobs/{job}/checkpoints")["latest"]["completed"]["id"]
            t_since = time.time()
            got = wait_checkpoints(rest, job, since, a.checkpoints, timeout_s=a.checkpoints * 60)
            t_until = time.time()
            out["load_savepoint"] = round(os.getloadavg()[0], 2)
            took, location = savepoint(rest, job, savepoint_dir, timeout_s=a.size_timeout)
        rows = checkpoint_rows(a.catalog, job)
        out["checkpoints"] = checkpoint_summary(rows, since=t_since, until=t_until)
        out["checkpoints"]["waited_for"] = got
        meta = checkpoint_storage.read_metadata(location)
        out["savepoint"] = {
            "seconds": round(took, 2),
            "state_size_bytes": meta["size_bytes"],
            "files": meta["files"],
            "batch_id": meta["spark"]["batch_id"],
            "copy_alone_ms": snapshot_copy_ms(location, savepoint_dir.parent),
        }
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
        wait_warm(cluster, 1)
        out["load_restore"] = wait_quiet(a.max_load, a.load_wait, echo=log)
        stream.repeat(0, a.trickle_events)  # new input, so the restored query has a batch to run
        out["restore"] = restore(rest, jar, args, config, location, timeout_s=a.size_timeout)
        jobs.append(out["restore"]["job"])
        ck, sp, rs = out["checkpoints"], out["savepoint"], out["restore"]
        log(
            f"  {label(target)}: {out['grow']['keys']} keys, state {out['grow']['state_size_bytes'] / 1e6:.1f} MB "
            f"(savepoint {sp['state_size_bytes'] / 1e6:.1f} MB, {sp['files']} files, copied alone in "
            f"{sp['copy_alone_ms']} ms); checkpoints {ck['completed']}: "
            f"driver p50 {ck['driver_ms']['p50']} / p99 {ck['driver_ms']['p99']} ms, trigger->ack p50 "
            f"{ck['trigger_to_ack_ms']['p50']} / p99 {ck['trigger_to_ack_ms']['p99']} ms (load "
            f"{out['load_checkpoints']}); savepoint {sp['seconds']} s (load {out['load_savepoint']}); restore "
            f"RUNNING {rs['post_to_running_s']} s, first batch {rs['post_to_first_batch_s']} s "
            f"(load {out['load_restore']})"
        )
    finally:
        for j in jobs:
            if rest.job(j)["state"] not in ("CANCELED", "FAILED", "FINISHED"):
                rest.cancel(j)
                rest.wait_state(j, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
        stream.drop()
        # Gigabytes of snapshots and live state per size: free the disk before the next one.
        for j in jobs:
            shutil.rmtree(cluster.settings.checkpoints / j, ignore_errors=True)
        shutil.rmtree(savepoint_dir, ignore_errors=True)
    return out


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10MB,100MB,1GB", help="comma-separated target state sizes")
    ap.add_argument("--provider", choices=("auto", "hdfs", "rocksdb"), default="auto")
    ap.add_argument(
        "--rocksdb-from",
        type=parse_size,
        default=parse_size("100MB"),
        help="with --provider auto: sizes from this one up use RocksDB",
    )
    ap.add_argument("--key-bytes", type=int, default=80)
    ap.add_argument(
        "--max-entries-per-trigger",
        type=int,
        default=500,
        help="stream entries (of 1000 events) per micro-batch while growing",
    )
    ap.add_argument("--interval", default="1 s", help="checkpoint interval")
    ap.add_argument(
        "--trickle-events",
        type=int,
        default=100,
        help="updates of existing keys every 0.5 s while checkpoints are measured",
    )
    ap.add_argument("--checkpoints", type=int, default=10, help="checkpoints measured at each size")
    ap.add_argument(
        "--size-timeout", type=float, default=600, help="seconds to grow each size (then: measured as far as it got)"
    )
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--load-wait", type=float, default=300)
    ap.add_argument("--smoke", action="store_true", help="one tiny size, 3 checkpoints, no waiting for quiet")
    ap.add_argument("--keep", action="store_true", help="keep the temporary home; kept anyway after a failure")
    a = ap.parse_args()
    if a.smoke:
        a.sizes, a.checkpoints, a.load_wait, a.size_timeout = "1MB", 3, 0, 60
    sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    home = Path(tempfile.mkdtemp(prefix="headrace-state-sizes-"))
    log(f"home {home}")
    a.catalog = f"sqlite:///{home / 'catalog.db'}"
    result: dict = {
        "machine": machine(),
        "key_bytes": a.key_bytes,
        "interval": a.interval,
        "max_entries_per_trigger": a.max_entries_per_trigger,
        "sizes": [],
    }
    cluster = None
    ok = False
    try:
        cluster = start_cluster(
            home, catalog_url=a.catalog, taskmanagers=2, slots=2, warm_drivers=1, pipeline_catalog_url=sink_db_url(home)
        )
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(PIPELINE)
        for target in sizes:
            result["sizes"].append(measure_size(cluster, rest, jar, home, target, a))
        ok = True
    finally:
        if cluster is not None:
            cluster.stop()
        if ok and not a.keep:
            shutil.rmtree(home, ignore_errors=True)
        else:
            log(f"kept {home} (logs under runs/*/logs)")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
