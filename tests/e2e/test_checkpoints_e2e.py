"""Checkpoints and savepoints end to end, on the multi-process cluster with real Redis, Spark and
PostgreSQL, under an outside producer:

  job A (parallelism 1, a checkpoint every CHECKPOINT_INTERVAL)
    -> savepoint -> kill -9 of its TaskManager (restart from the latest checkpoint)
    -> stop with savepoint (job FINISHED)
  the savepoint directory is moved elsewhere
  job B from the moved savepoint with parallelism 2 (a refused incompatible pipeline first)
    -> kill -9 of its TaskManager -> the producer stops
  the sink holds exactly the count and sum of every key: nothing lost, nothing twice.

Once with the SQL sink (running totals upserted by key) and once with the Parquet sink (event-time
windows appended when the watermark closes them; its drill leaves the kills to the SQL one).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections import Counter
from datetime import timedelta, timezone
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from shared import checkpoint_storage as storage
from shared import job_options
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import (
    BASE,
    CHECKPOINT_INTERVAL,
    KEYS,
    STEP_MS,
    TRIGGER,
    Producer,
    completed_checkpoints,
    expected_totals,
    sql_totals,
)
from tests.e2e.drills import kill_task_taskmanager, runner_processes, savepoint
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    # Savepoints go to (and are moved between) the tests' own directories: a storage root here.
    c = start_cluster(
        tmp_path_factory.mktemp("chk-home"),
        catalog_url=pg_url_module,
        taskmanagers=2,
        slots=2,
        warm_drivers=1,
        restart_strategy={"type": "fixed-delay", "attempts": 10, "delay": "1 s"},
        storage_roots=str(tmp_path_factory.getbasetemp()),
    )
    yield c, pg_url_module
    c.stop()


def expected_windows(produced: int) -> Counter:
    got: Counter = Counter()
    for n in range(produced):
        t = BASE + timedelta(milliseconds=n * STEP_MS)
        start = t.replace(second=t.second - t.second % 10, microsecond=0)
        got[(start.replace(tzinfo=None), f"k{n % KEYS}")] += 1
    return got


def drill(
    c,
    rest: Rest,
    tmp: Path,
    args: list[str],
    producer: Producer,
    changed: Path | None = None,
    kill_a: bool = True,
    kill_b: bool = True,
) -> None:
    jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
    config = {"execution.checkpointing.interval": CHECKPOINT_INTERVAL, "state.checkpoints.num-retained": 2}
    a = rest.run(jar, parallelism=1, jobName="counts-a", programArgsList=args, flinkConfiguration=config)
    rest.wait_attempt_running(a, 0, timeout_s=300)
    wait_for("two completed checkpoints of job A", lambda: completed_checkpoints(rest, a) >= 2, 90, poll_s=0.25)

    savepoint(rest, a, "savepoints", {"target-directory": str(tmp / "savepoints")})
    after_savepoint = completed_checkpoints(rest, a)
    wait_for(
        "a checkpoint after the savepoint", lambda: completed_checkpoints(rest, a) > after_savepoint, 60, poll_s=0.25
    )
    if kill_a:
        kill_task_taskmanager(c, rest, a)
        restored = rest.attempts(a)[-1]["restored-from"]
        assert restored and "/chk-" in restored, rest.attempts(a)
        before = completed_checkpoints(rest, a)
        wait_for(
            "a checkpoint of the restarted attempt", lambda: completed_checkpoints(rest, a) > before, 90, poll_s=0.25
        )

    stopped = savepoint(rest, a, "stop", {"targetDirectory": str(tmp / "savepoints"), "drain": False})
    assert rest.wait_state(a, ("FINISHED", "FAILED", "CANCELED"), timeout_s=60)["state"] == "FINISHED"
    moved = tmp / "elsewhere" / Path(stopped).name
    moved.parent.mkdir(parents=True)
    shutil.move(stopped, moved)
    # The plan's signature is worked out at the first snapshot, off the task's start: it is there.
    assert storage.read_metadata(moved)["pipeline"]["plan"]["operators"], storage.read_metadata(moved)["pipeline"]

    if changed is not None:  # a new grouping key cannot reuse the savepoint's state
        bad = rest.upload(changed)
        # The dispatcher plans the changed pipeline in a cold Spark first (15-30 s here).
        r = rest.http.post(f"/jars/{bad}/run", json={"programArgsList": args, "savepointPath": str(moved)}, timeout=240)
        assert r.status_code == 400, r.text
        assert "key" in json.dumps(r.json()).lower(), r.text

    b = rest.run(
        jar,
        parallelism=2,
        jobName="counts-b",
        programArgsList=args,
        flinkConfiguration=config,
        savepointPath=f"file://{moved}",
    )
    attempts = rest.wait_attempt_running(b, 0, timeout_s=300)
    assert attempts[-1]["restored-from"] == str(moved)
    wait_for("a checkpoint of job B", lambda: completed_checkpoints(rest, b) >= 1, 90, poll_s=0.25)
    if kill_b:
        kill_task_taskmanager(c, rest, b)
    return b


def test_sql_sink_exact_through_savepoints_rescale_and_kills(cluster, tmp_path):
    c, pg = cluster
    rest = Rest(c.dispatcher_url)
    stream = "e2e-counts-sql"
    producer = Producer(c.redis_url, stream).start()
    changed = tmp_path / "keyed_counts_by_parity.py"
    changed.write_text(
        (ROOT / "examples" / "keyed_counts.py")
        .read_text()
        .replace('events.groupBy("key")', 'events.groupBy("key", (F.col("value") % 2).alias("parity"))')
    )
    args = ["--stream", stream, "--sink", "sql", "--table", "e2e_keyed", "--sink-url", pg, "--trigger", TRIGGER]
    try:
        b = drill(c, rest, tmp_path, args, producer, changed=changed)
    finally:
        produced = producer.stop()
    expected = expected_totals(produced)

    wait_for(
        f"the sink to hold exactly {produced} events", lambda: sql_totals(pg, "e2e_keyed") == expected, 120, poll_s=0.25
    )
    rest.cancel(b)
    assert rest.wait_state(b, ("CANCELED",), timeout_s=60)["state"] == "CANCELED"


def test_parquet_sink_exact_through_savepoints_rescale_and_kills(cluster, tmp_path):
    c, _ = cluster
    rest = Rest(c.dispatcher_url)
    stream = "e2e-counts-parquet"
    out = tmp_path / "windows"
    producer = Producer(c.redis_url, stream).start()
    args = ["--stream", stream, "--sink", "parquet", "--path", str(out), "--window", "10 seconds", "--trigger", TRIGGER]
    try:
        # The kills are the SQL drill's (and the file sink's failover is tests/integration/
        # test_sink_fencing.py's): this one checks the windows through savepoints and a rescale.
        b = drill(c, rest, tmp_path, args, producer, kill_a=False, kill_b=False)
    finally:
        produced = producer.stop()
    producer.flush_windows()
    expected = expected_windows(produced)

    def sink():
        got = parquet_windows(out)
        return got if got == expected else None

    wait_for(f"the Parquet windows to hold exactly {produced} events", sink, 120, poll_s=0.25)
    rest.cancel(b)
    assert rest.wait_state(b, ("CANCELED",), timeout_s=60)["state"] == "CANCELED"


def test_stop_with_drain_fires_every_open_window(cluster, tmp_path):
    """A drained stop ends event time: windows the watermark has not closed yet are written
    before the final savepoint, with no flush event from the producer."""
    c, _ = cluster
    rest = Rest(c.dispatcher_url)
    stream = "e2e-counts-drain"
    out = tmp_path / "drained"
    producer = Producer(c.redis_url, stream, rate=400)
    for n in range(1200):  # 24 s of event time: the last windows stay open without a drain
        producer.client.xadd(stream, {"json": json.dumps(producer.event(n))})
    jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
    job = rest.run(
        jar,
        parallelism=1,
        jobName="counts-drain",
        programArgsList=[
            "--stream",
            stream,
            "--sink",
            "parquet",
            "--path",
            str(out),
            "--window",
            "10 seconds",
            "--trigger",
            TRIGGER,
        ],
    )
    rest.wait_attempt_running(job, 0, timeout_s=300)
    # Windows [0 s, 10 s) and [10 s, 20 s) close by themselves (1000 events); [20 s, 30 s) stays open.
    wait_for("the closed windows in the output", lambda: sum(parquet_windows(out).values()) >= 1000, 120, poll_s=0.25)
    assert sum(parquet_windows(out).values()) == 1000
    location = savepoint(rest, job, "stop", {"targetDirectory": str(tmp_path / "sp"), "drain": True})
    assert rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=60)["state"] == "FINISHED"
    assert parquet_windows(out) == expected_windows(1200)
    assert Path(location).exists()


def parquet_windows(out: Path) -> Counter:
    """(window start in UTC, key) -> count in the Parquet output (the flush key left out)."""
    got: Counter = Counter()
    if not out.exists():
        return got
    for row in pads.dataset(str(out), format="parquet").to_table().to_pylist():
        if row["key"] == "_flush":
            continue
        start = row["window_start"]
        start = start.astimezone(timezone.utc).replace(tzinfo=None) if start.tzinfo else start
        got[(start, row["key"])] += row["count"]
    return got


def test_frozen_taskmanager_thawed_costs_one_restart_and_its_zombie_writes_nothing(cluster, tmp_path):
    """SIGSTOP the TaskManager running the task (and its driver) past the heartbeat timeout: the
    task moves. SIGCONT: the old driver wakes up with its query still running. It has its own
    live directory, so it cannot break the new attempt (one restart, not two), and the sink
    fences it off, so the totals stay exact."""
    c, pg = cluster
    rest = Rest(c.dispatcher_url)
    stream = "e2e-counts-freeze"
    producer = Producer(c.redis_url, stream).start()
    args = ["--stream", stream, "--sink", "sql", "--table", "e2e_freeze", "--sink-url", pg, "--trigger", TRIGGER]
    jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
    try:
        job = rest.run(
            jar,
            parallelism=1,
            jobName="counts-freeze",
            programArgsList=args,
            flinkConfiguration={"execution.checkpointing.interval": CHECKPOINT_INTERVAL},
        )
        rest.wait_attempt_running(job, 0, timeout_s=300)
        wait_for("two completed checkpoints", lambda: completed_checkpoints(rest, job) >= 2, 90, poll_s=0.25)
        tm = rest.attempts(job)[-1]["taskmanager-id"]
        name = {"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[tm]
        groups = [c.child(name).proc.pid] + [d.pid for d in runner_processes(c.child(name).proc.pid)]
        for g in groups:
            os.killpg(g, signal.SIGSTOP)
        try:
            rest.wait_attempt_running(job, 1, timeout_s=120)
        finally:
            for g in groups:
                os.killpg(g, signal.SIGCONT)
        wait_for("checkpoints after the thaw", lambda: completed_checkpoints(rest, job) >= 4, 120, poll_s=0.25)
    finally:
        produced = producer.stop()
    expected = expected_totals(produced)

    wait_for(
        f"the sink to hold exactly {produced} events",
        lambda: sql_totals(pg, "e2e_freeze") == expected,
        120,
        poll_s=0.25,
    )
    attempts = rest.attempts(job)
    assert [a["attempt"] for a in attempts] == [0, 1], attempts  # one restart, not two
    assert attempts[-1]["status"] == "RUNNING"
    rest.cancel(job)
    assert rest.wait_state(job, ("CANCELED",), timeout_s=60)["state"] == "CANCELED"


def test_the_latency_mode_starts_each_batch_at_once_on_two_state_partitions_and_counts_exactly(cluster, tmp_path):
    """headrace.latency-mode: the pipeline's own trigger (5 s here) gives way to the next
    micro-batch at once, the first start pins LATENCY_STATE_PARTITIONS state partitions, and
    the sink's totals are exact."""
    c, pg = cluster
    rest = Rest(c.dispatcher_url)
    stream, table = "e2e-counts-latency", "e2e_latency"
    producer = Producer(c.redis_url, stream, rate=100).start()
    jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
    args = ["--stream", stream, "--sink", "sql", "--table", table, "--sink-url", pg, "--trigger", "5 seconds"]
    job = rest.run(
        jar,
        parallelism=2,
        jobName="counts-latency",
        programArgsList=args,
        flinkConfiguration={"headrace.latency-mode": True},
    )
    rest.wait_attempt_running(job, 0, timeout_s=300)
    wait_for("the first batch in the sink", lambda: sql_totals(pg, table), 120, poll_s=0.25)
    running_since = time.monotonic()
    time.sleep(12)
    produced = producer.stop()
    wait_for("every event in the sink", lambda: sql_totals(pg, table) == expected_totals(produced), 60, poll_s=0.25)
    elapsed = time.monotonic() - running_since
    location = savepoint(rest, job, "stop", {"targetDirectory": str(tmp_path / "sp"), "drain": False})
    assert rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=60)["state"] == "FINISHED"
    assert sql_totals(pg, table) == expected_totals(produced)
    spark = storage.read_metadata(Path(location))["spark"]
    assert spark["state_partitions"] == job_options.LATENCY_STATE_PARTITIONS
    # A 5 s trigger could not have run more than elapsed / 5 + 2 batches in that time.
    assert spark["batch_id"] > elapsed / 5 + 2, (spark["batch_id"], elapsed)
    logs = "\n".join(
        p.read_text(errors="replace") for p in Path(c.settings.home).glob("work/taskmanagers/*/logs/driver-*.log")
    )
    assert "latency mode: the pipeline's trigger (5 seconds) is not used" in logs
