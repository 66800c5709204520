"""Issue 21, findings 8 and 9, on a real cluster (Redis, PostgreSQL catalog, Spark drivers,
two TaskManagers of two slots each), as an operator with a token or a broken disk would meet them:

  * savepoint targets, stop targets and restore paths outside the storage roots are 400 at the
    REST call, nothing is written there, and the job runs on;
  * a job whose latest completed checkpoint was damaged on disk, after its task is killed,
    restarts from the checkpoint before it (the damaged one is marked in the catalog, the
    exception history says so), and its SQL sink ends with every event exactly once;
  * a job of parallelism 3 on 2-slot TaskManagers fails within seconds with the reason, and is
    not restarted.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.clusters import Rest, start_cluster
from tests.e2e.counting import (
    CHECKPOINT_INTERVAL,
    TRIGGER,
    Producer,
    completed_checkpoints,
    expected_totals,
    sql_totals,
)
from tests.e2e.drills import runner_processes
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RESTARTS = {"type": "fixed-delay", "attempts": 5, "delay": "1 s"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("roots-home"),
        catalog_url=pg_url_module,
        taskmanagers=2,
        slots=2,
        warm_drivers=1,
        restart_strategy=RESTARTS,
    )
    yield c, pg_url_module
    c.stop()


@pytest.fixture(scope="module")
def rest(cluster):
    return Rest(cluster[0].dispatcher_url)


def noop(rest: Rest, tmp: Path, parallelism: int = 1) -> str:
    jar = rest.upload_noop_pipeline(tmp)
    return rest.run(jar, kind="noop", parallelism=parallelism, restartStrategy=RESTARTS, config={"noop.duration": -1})


def test_snapshot_paths_outside_the_storage_roots_are_refused_at_the_rest_call(cluster, rest, tmp_path):
    c, _ = cluster
    job = noop(rest, tmp_path)
    rest.wait_running_task(job)
    victim = Path("/etc") / f"headrace-{job[:8]}"
    for route, body in (
        ("savepoints", {"target-directory": str(victim)}),
        ("savepoints", {"target-directory": f"{c.settings.savepoints}/../../../../etc/x"}),
        ("stop", {"targetDirectory": f"file://{victim}"}),
    ):
        r = rest.http.post(f"/jobs/{job}/{route}", json=body)
        assert r.status_code == 400, r.text
        err = r.json()
        assert "outside the allowed storage roots" in err["errors"][0] and "storage_roots" in err["errors"][0]
        assert str(c.settings.savepoints) in err["allowed-roots"]
    assert not victim.exists() and not list(Path("/etc").glob("savepoint-*"))
    time.sleep(1)  # a trigger that slipped through would have stopped the job by now
    assert rest.job(job)["state"] == "RUNNING" and rest.wait_running_task(job)
    assert rest.get(f"/jobs/{job}/checkpoints")["counts"]["total"] == 0
    # Starting from a snapshot outside the roots: 400 as well, no job.
    before = len(rest.get("/jobs")["jobs"])
    jar = rest.upload_noop_pipeline(tmp_path)
    r = rest.http.post(f"/jars/{jar}/run", json={"kind": "noop", "savepointPath": "/etc"})
    assert r.status_code == 400 and r.json()["field"] == "savepointPath", r.text
    assert len(rest.get("/jobs")["jobs"]) == before
    rest.cancel(job)
    rest.wait_state(job, "CANCELED")


def test_parallelism_above_every_taskmanager_fails_at_once_with_the_reason(cluster, rest, tmp_path):
    started = time.monotonic()
    job = noop(rest, tmp_path, parallelism=3)
    final = rest.wait_state(job, ("FAILED",), timeout_s=30)
    assert time.monotonic() - started < 30  # not the slot request timeout (300 s), four times
    history = rest.get(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"]
    assert len(history) == 1 and history[0]["exceptionName"] == "NoResourceAvailableException"
    assert history[0]["stacktrace"].startswith(
        "parallelism 3 needs 3 slots on one TaskManager; the largest "
        "registered TaskManager has 2 (tm-1, tm-2; 2 registered)"
    )
    assert [a["attempt"] for a in rest.attempts(job)] == [0] and not final["timestamps"].get("RESTARTING")


def _damage(snapshot: Path) -> list[str]:
    """What a failing disk or a careless clean-up leaves: the offset and commit logs cut short (the
    snapshot's own copies), its state files gone. (State files are hard links shared with the
    checkpoints before it: overwriting one in place would damage those too, and the fallback
    would then walk back through all of them.)"""
    damaged = []
    for f in sorted((snapshot / "spark").rglob("*")):
        if not f.is_file():
            continue
        if "state" in f.relative_to(snapshot).parts:
            f.unlink()
        elif f.parent.name in ("offsets", "commits"):
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        else:
            continue
        damaged.append(str(f.relative_to(snapshot)))
    return damaged


def _checkpoint_history(rest: Rest, job: str) -> dict[int, dict]:
    return {h["id"]: h for h in rest.get(f"/jobs/{job}/checkpoints")["history"]}


def test_a_damaged_latest_checkpoint_restarts_from_the_one_before_with_exact_counts(cluster, rest):
    c, pg = cluster
    stream, table = "e2e-damaged-chk", "e2e_damaged_chk"
    producer = Producer(c.redis_url, stream).start()
    jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
    args = ["--stream", stream, "--sink", "sql", "--table", table, "--sink-url", pg, "--trigger", TRIGGER]
    config = {"execution.checkpointing.interval": CHECKPOINT_INTERVAL, "state.checkpoints.num-retained": 3}
    try:
        job = rest.run(
            jar,
            parallelism=1,
            jobName="damaged",
            programArgsList=args,
            flinkConfiguration=config,
            restartStrategy=RESTARTS,
        )
        rest.wait_attempt_running(job, 0, timeout_s=300)
        wait_for("four completed checkpoints", lambda: completed_checkpoints(rest, job) >= 4, 120, poll_s=0.25)
        # Freeze the driver so that no newer checkpoint completes, then damage the latest one.
        attempt = rest.attempts(job)[-1]
        tm = c.child({"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[attempt["taskmanager-id"]])
        # Every driver of that TaskManager (its warm one too: killing it only makes a new one).
        drivers = {d.pid for d in runner_processes(tm.proc.pid)}
        session = [p for p in psutil.process_iter() if _sid(p) in drivers]
        for p in session:
            _signal(p, signal.SIGSTOP)
        time.sleep(1.5)  # an acknowledgement already on its way lands
        history = _checkpoint_history(rest, job)
        latest = max(i for i, h in history.items() if h["status"] == "COMPLETED")
        previous = max(i for i, h in history.items() if h["status"] == "COMPLETED" and i < latest)
        latest_path = Path(history[latest]["external_path"].removeprefix("file:"))
        assert _damage(latest_path)
        for p in session:
            _signal(p, signal.SIGKILL)

        # The restart from the damaged checkpoint fails, the next one starts from the one before.
        def restored_from_previous():
            attempts = rest.attempts(job)
            last = attempts[-1]
            return (
                last["status"] == "RUNNING" and (last["restored-from"] or "").endswith(f"/chk-{previous}") and attempts
            )

        attempts = wait_for(f"an attempt restored from chk-{previous}", restored_from_previous, 300, poll_s=0.25)
        assert any(
            a["restored-from"] and a["restored-from"].endswith(f"/chk-{latest}") and a["status"] == "FAILED"
            for a in attempts
        ), attempts
        wait_for(
            "a checkpoint of the restored attempt",
            lambda: completed_checkpoints(rest, job) > len([h for h in history.values() if h["status"] == "COMPLETED"]),
            90,
            poll_s=0.25,
        )
    finally:
        produced = producer.stop()
    expected = expected_totals(produced)
    wait_for(f"the sink to hold exactly {produced} events", lambda: sql_totals(pg, table) == expected, 180, poll_s=0.25)

    marked = _checkpoint_history(rest, job)[latest]
    assert marked["discarded"] is True  # Flink shows a discarded checkpoint as COMPLETED, discarded
    assert marked["failure_message"].startswith("restore failed: the snapshot ")
    entries = rest.get(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"]
    [fallback] = [e for e in entries if e["exceptionName"] == "SnapshotRestoreError"]
    assert fallback["stacktrace"].startswith(f"checkpoint {latest} could not be restored (the snapshot ")
    assert f"; restarting from checkpoint {previous}\n" in fallback["stacktrace"]
    assert (latest_path / "_metadata").is_file()  # kept for inspection
    rest.cancel(job)
    rest.wait_state(job, "CANCELED")
    # The TaskManager whose driver was killed keeps serving: nothing else to clean up.
    assert tm.proc.poll() is None


def _sid(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
