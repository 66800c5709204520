"""Delta Lake tables end to end, on a local multi-process cluster with real Redis, Spark and
PostgreSQL, under an outside producer of numbered events (tests/e2e/counting.py). Each table is
read back by delta-rs (the `deltalake` package, no Spark) and by Spark:

  * append under a TaskManager kill -9: every event in the table once;
  * counts per key MERGEd by key through a stop-with-savepoint and a resume at parallelism 2:
    every key's count and sum exact;
  * a deployment upgraded to a version that writes a few batches, then fails and never completes
    a checkpoint, is rolled back: no row of that version is left, every event is there once;
  * a driver frozen (SIGSTOP with its TaskManager) until its task runs elsewhere, then woken: it
    commits nothing, and the table holds every event once.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from services.taskmanager.runtime.connectors import delta_log
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import CHECKPOINT_INTERVAL, TRIGGER, Producer, completed_checkpoints, expected_totals
from tests.e2e.drills import kill_task_taskmanager, runner_processes, savepoint
from tests.waiting import wait_for

PIPELINE = Path(__file__).resolve().parent / "delta_counts.py"
RESTARTS = {"type": "fixed-delay", "attempts": 10, "delay": "1 s"}
# A new driver's first Delta commit loads Delta's classes: on 2 cores shared with other runs (load
# 20-30) a task took more than a minute to report RUNNING, so the versions get 4 minutes to be ready.
READY_WITHIN_S = 240


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("delta-home"),
        catalog_url=pg_url_module,
        taskmanagers=2,
        slots=2,
        warm_drivers=1,
        restart_strategy=RESTARTS,
        storage_roots=str(tmp_path_factory.getbasetemp()),
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A reader of our own: Spark with Delta, as every driver has it."""
    from services.taskmanager.runtime.spark_session import build_spark

    session = build_spark(1, tmp_path_factory.mktemp("reader"), shuffle_partitions=1)
    yield session
    session.stop()


def table(c, name: str) -> Path:
    return Path(c.settings.lake) / name


def rs_rows(path: Path) -> list[dict]:
    """The table as delta-rs reads it; [] before the job created it."""
    if not (path / "_delta_log").is_dir():
        return []
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def events_once(path: Path, produced: int) -> bool:
    seen = Counter(r["n"] for r in rs_rows(path))
    return set(seen) == set(range(produced)) and all(v == 1 for v in seen.values())


def events_off(path: Path, produced: int) -> str:
    """What keeps the table from holding every event once (for a failure's message)."""
    seen = Counter(r["n"] for r in rs_rows(path))
    missing = sorted(set(range(produced)) - set(seen))
    twice = sorted(n for n, v in seen.items() if v > 1)
    return (
        f"{len(missing)} missing (first {missing[:5]}), {len(twice)} more than once (first {twice[:5]}), "
        f"{len(set(seen) - set(range(produced)))} unknown"
    )


def totals(path: Path) -> dict[str, tuple[int, int]]:
    return {r["key"]: (r["count"], r["total"]) for r in rs_rows(path)}


def run(rest: Rest, jar: str, args: list[str], *, parallelism: int = 1, name: str, **body) -> str:
    config = {"execution.checkpointing.interval": CHECKPOINT_INTERVAL, "state.checkpoints.num-retained": 2}
    return rest.run(jar, parallelism=parallelism, jobName=name, programArgsList=args, flinkConfiguration=config, **body)


def test_append_under_a_taskmanager_kill_writes_every_event_once(cluster, spark):
    rest = Rest(cluster.dispatcher_url)
    stream, name = "e2e-delta-append", "e2e/append"
    producer = Producer(cluster.redis_url, stream).start()
    jar = rest.upload(PIPELINE)
    try:
        job = run(rest, jar, ["--stream", stream, "--table", name, "--trigger", TRIGGER], name="delta-append")
        rest.wait_attempt_running(job, 0, timeout_s=300)
        wait_for("two completed checkpoints", lambda: completed_checkpoints(rest, job) >= 2, 120, poll_s=0.25)
        kill_task_taskmanager(cluster, rest, job)
        before = completed_checkpoints(rest, job)
        wait_for(
            "a checkpoint of the restarted attempt", lambda: completed_checkpoints(rest, job) > before, 120, poll_s=0.25
        )
    finally:
        produced = producer.stop()
    path = table(cluster, name)
    wait_for(f"every one of {produced} events once in the table", lambda: events_once(path, produced), 300, poll_s=0.25)
    rows = spark.read.format("delta").load(str(path)).groupBy("n").count()
    assert rows.count() == produced and rows.filter("count > 1").count() == 0
    # The checkpoint history names the table and the version each checkpoint committed.
    history = rest.get(f"/jobs/{job}/checkpoints")["history"]
    assert any(h.get("sink_table") == str(path) and isinstance(h.get("sink_version"), int) for h in history)
    rest.cancel(job)
    rest.wait_state(job, ("CANCELED",), timeout_s=60)


def test_counts_per_key_through_stop_with_savepoint_and_resume_at_parallelism_2(cluster, spark, tmp_path):
    rest = Rest(cluster.dispatcher_url)
    stream, name = "e2e-delta-totals", "e2e/totals"
    producer = Producer(cluster.redis_url, stream).start()
    jar = rest.upload(PIPELINE)
    args = ["--stream", stream, "--table", name, "--mode", "totals", "--trigger", TRIGGER]
    try:
        a = run(rest, jar, args, name="delta-totals-a")
        rest.wait_attempt_running(a, 0, timeout_s=300)
        wait_for("two completed checkpoints of job A", lambda: completed_checkpoints(rest, a) >= 2, 120, poll_s=0.25)
        location = savepoint(rest, a, "stop", {"targetDirectory": str(tmp_path / "sp"), "drain": False})
        assert rest.wait_state(a, ("FINISHED", "FAILED", "CANCELED"), timeout_s=60)["state"] == "FINISHED"
        b = run(rest, jar, args, parallelism=2, name="delta-totals-b", savepointPath=location)
        rest.wait_attempt_running(b, 0, timeout_s=300)
        wait_for("two completed checkpoints of job B", lambda: completed_checkpoints(rest, b) >= 2, 120, poll_s=0.25)
    finally:
        produced = producer.stop()
    path = table(cluster, name)
    expected = expected_totals(produced)
    wait_for(f"exact totals of {produced} events", lambda: totals(path) == expected, 180, poll_s=0.25)
    by_spark = {r["key"]: (r["count"], r["total"]) for r in spark.read.format("delta").load(str(path)).collect()}
    assert by_spark == expected
    rest.cancel(b)
    rest.wait_state(b, ("CANCELED",), timeout_s=60)


def test_a_failed_upgrade_rolled_back_leaves_no_row_of_it_and_every_event_once(cluster, spark, tmp_path):
    rest = Rest(cluster.dispatcher_url)
    stream, name, deployment = "e2e-delta-deploy", "e2e/deploy", "delta-deploy"
    producer = Producer(cluster.redis_url, stream, rate=40).start()
    jar = rest.upload(PIPELINE)
    # 100 events a batch at most, over twice the producer's rate: v2 writes a few batches before it
    # reaches `fail_at`, and v1 catches up with what was produced meanwhile.
    base = ["--stream", stream, "--table", name, "--trigger", TRIGGER, "--max-entries-per-trigger", "100"]

    def spec(args: list[str], interval: str = CHECKPOINT_INTERVAL) -> dict:
        return {
            "jarId": jar,
            "programArgsList": args,
            "parallelism": 1,
            "flinkConfiguration": {"execution.checkpointing.interval": interval},
            "restartStrategy": RESTARTS,
            "upgradeMode": "savepoint",
            "rollback": {"enabled": True, "readyWithin": f"{READY_WITHIN_S} s"},
        }

    def put(body: dict) -> int:
        r = rest.http.put(f"/deployments/{deployment}", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["generation"]

    def state(lifecycle: str, generation: int | None = None):
        st = rest.get(f"/deployments/{deployment}")["status"]
        return st if st["lifecycleState"] == lifecycle and generation in (None, st["jobGeneration"]) else None

    path = table(cluster, name)
    try:
        put(spec([*base, "--tag", "v1"]))
        wait_for("v1 STABLE", lambda: state("STABLE", 1), 300, poll_s=0.25)
        # v2 writes batches for a while, then fails at every batch reaching `fail_at`,
        # and never completes a checkpoint (its interval is 10 min): the deployment rolls it back.
        # v2 starts where v1's savepoint stopped, which under load came 7+ s after the PUT, and reads
        # 100 events a batch: fail_at leaves it a minute of the producer's events (40/s) to write
        # some batches of its own first, whatever the upgrade took.
        fail_at = producer.produced + 400 + 40 * 60
        put(spec([*base, "--tag", "v2", "--fail-at", str(fail_at)], interval="10 min"))
        wait_for(
            "rows of v2 in the table", lambda: any(r["tag"] == "v2" for r in rs_rows(path)), READY_WITHIN_S, poll_s=0.25
        )
        back = wait_for("the rollback to v1", lambda: state("ROLLED_BACK"), 2 * READY_WITHIN_S + 60, poll_s=0.25)
        assert back["jobGeneration"] == 1
        wait_for("checkpoints of v1 again", lambda: completed_checkpoints(rest, back["jobId"]) >= 2, 120, poll_s=0.25)
    finally:
        produced = producer.stop()
    try:
        wait_for(
            f"every one of {produced} events once in the table", lambda: events_once(path, produced), 300, poll_s=0.25
        )
    except AssertionError as exc:
        status = rest.get(f"/deployments/{deployment}")["status"]
        job_id = status.get("jobId")
        job = f"{rest.job(job_id)['state']}: {rest.get(f'/jobs/{job_id}/exceptions')}" if job_id else "none"
        raise AssertionError(f"{exc}: {events_off(path, produced)}; deployment {status}; its job {job}") from None
    assert {r["tag"] for r in rs_rows(path)} == {"v1"}
    df = spark.read.format("delta").load(str(path))
    assert df.filter("tag != 'v1'").count() == 0 and df.count() == produced
    undo = [h for h in DeltaTable(str(path)).history() if h["operation"] == "RESTORE"]
    assert undo and any("undo to version" in (h.get("userMetadata") or "") for h in undo)
    assert rest.http.delete(f"/deployments/{deployment}").status_code == 202


def test_a_frozen_driver_woken_after_its_task_moved_commits_nothing(cluster, spark):
    rest = Rest(cluster.dispatcher_url)
    stream, name = "e2e-delta-zombie", "e2e/zombie"
    producer = Producer(cluster.redis_url, stream).start()
    jar = rest.upload(PIPELINE)
    path = table(cluster, name)
    try:
        job = run(rest, jar, ["--stream", stream, "--table", name, "--trigger", TRIGGER], name="delta-zombie")
        rest.wait_attempt_running(job, 0, timeout_s=300)
        wait_for("two completed checkpoints", lambda: completed_checkpoints(rest, job) >= 2, 120, poll_s=0.25)
        tm = rest.attempts(job)[-1]["taskmanager-id"]
        child = {"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[tm]
        groups = [cluster.child(child).proc.pid] + [d.pid for d in runner_processes(cluster.child(child).proc.pid)]
        for g in groups:
            os.killpg(g, signal.SIGSTOP)
        try:
            rest.wait_attempt_running(job, 1, timeout_s=180)
            new_fence = wait_for("the new attempt's fence commit", lambda: fence_version(path, seq=2), 120, poll_s=0.25)
        finally:
            for g in groups:
                os.killpg(g, signal.SIGCONT)
        woke = time.monotonic()
        wait_for("checkpoints after the thaw", lambda: completed_checkpoints(rest, job) >= 4, 120, poll_s=0.25)
        time.sleep(max(0.0, 10 - (time.monotonic() - woke)))  # the zombie's query had time to try
    finally:
        produced = producer.stop()
    wait_for(f"every one of {produced} events once in the table", lambda: events_once(path, produced), 300, poll_s=0.25)
    # Nothing of the first attempt (seq 1) was committed after the second one fenced it.
    app = next(a for a in DeltaTable(str(path)).metadata().configuration if a.startswith("headrace.writer."))
    app_id = app.removeprefix("headrace.writer.")
    latest = DeltaTable(str(path)).version()
    late = [
        v
        for v in range(new_fence + 1, latest + 1)
        if (c := delta_log.commit(str(path), v)) is not None and delta_log.seq_of(c.txns.get(app_id)) == 1
    ]
    assert late == []
    assert spark.read.format("delta").load(str(path)).count() == produced
    rest.cancel(job)
    rest.wait_state(job, ("CANCELED",), timeout_s=60)


def fence_version(path: Path, *, seq: int) -> int | None:
    """The version of the fence commit of the attempt with `seq` (the first to take the sink over
    after a restore), or None before it."""
    latest = DeltaTable(str(path)).version()
    for v in range(latest, -1, -1):
        c = delta_log.commit(str(path), v)
        if c is not None and any(delta_log.seq_of(t) >= seq for t in c.txns.values()) and "fence" in c.user_metadata:
            return v
    return None
