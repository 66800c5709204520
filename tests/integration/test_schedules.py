"""Scheduled submissions on the real stack: ZooKeeper, two JobManagers electing a leader, the
ResourceManager, TaskManagers and the dispatcher as processes, PostgreSQL, no-op jobs.

The proof the issue asks for: a schedule ticking every 2 s fires exactly once per tick across a
kill -9 of the leading JobManager (the standby's beat takes over; ticks missed meanwhile are
recorded as skipped_misfire and the newest one fires once), and every run is a normal job linked to
its schedule. Also: REST validation, the skip overlap policy against a job that never ends, and
the CLI."""

from __future__ import annotations

import os
import signal
import time
from datetime import timezone

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from services.cli import app as cli
from shared.catalog import Catalog
from shared.catalog.models import Job, ScheduleRun
from tests.clusters import leader, leader_child, start_cluster
from tests.servers import missing
from tests.waiting import wait_for

EVERY_S = 2
OUTAGE_S = 5
TERMINAL = ("FINISHED", "FAILED", "CANCELED")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    from services.cluster.infrastructure import ZOOKEEPER_HOME

    if not (ZOOKEEPER_HOME / "bin" / "zkServer.sh").exists():
        missing("ZooKeeper (Debian package zookeeper)")
    c = start_cluster(
        tmp_path_factory.mktemp("schedules-home"),
        catalog_url=pg_url_module,
        slots=2,
        ha=True,
        jobmanagers=2,
        zookeeper_session_timeout_s=3.0,
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def catalog(cluster, pg_url_module):
    c = Catalog(pg_url_module)
    yield c
    c.dispose()


def create(rest, **body) -> str:
    r = rest.http.post("/jobs/schedules", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def runs(catalog, sid) -> list[tuple[int, str, str | None]]:
    """(tick in ms, outcome, job id), oldest first, straight from the catalog."""
    with catalog.session() as s:
        rows = (
            s.execute(select(ScheduleRun).where(ScheduleRun.schedule_id == sid).order_by(ScheduleRun.tick_at))
            .scalars()
            .all()
        )
        return [(int(r.tick_at.astimezone(timezone.utc).timestamp() * 1000), r.outcome, r.job_id) for r in rows]


def submitted(catalog, sid) -> list[str]:
    return [job for _, outcome, job in runs(catalog, sid) if outcome == "submitted"]


def test_rest_validation_and_the_shape_the_dashboard_reads(rest, jar):
    r = rest.http.post("/jobs/schedules", json={"jarId": jar, "kind": "noop", "cron": "61 * * * *"})
    assert r.status_code == 400
    body = r.json()
    assert body["field"] == "cron" and "minute" in body["errors"][0] and "*/5 * * * *" in body["hint"]
    r = rest.http.post("/v1/jobs/schedules", json={"jarId": jar, "cron": "* * *"})
    assert r.status_code == 400 and "has 3 fields" in r.json()["errors"][0]
    r = rest.http.post("/jobs/schedules", json={"jarId": jar, "cron": "* * * * *", "everySeconds": 5})
    assert r.status_code == 400 and r.json()["field"] == "cron"
    r = rest.http.post("/jobs/schedules", json={"jarId": "no-such-jar", "everySeconds": 5})
    assert r.status_code == 404 and "jar no-such-jar not found" in r.json()["errors"][0]
    r = rest.http.post("/jobs/schedules", json={"jarId": jar, "everySeconds": 5, "overlap": "sometimes"})
    assert r.status_code == 400 and r.json()["field"] == "overlap"
    assert rest.http.get("/jobs/schedules/0123").status_code == 404
    sid = create(rest, jarId=jar, kind="noop", cron="0 3 * * *", name="nightly", enabled=False)
    [listed] = [s for s in rest.get("/jobs/schedules")["schedules"] if s["id"] == sid]
    assert {
        k: listed[k]
        for k in (
            "name",
            "jarId",
            "entryClass",
            "cron",
            "everySeconds",
            "overlap",
            "misfireGraceSeconds",
            "enabled",
            "nextFire",
            "lastFire",
            "lastJobId",
            "lastOutcome",
            "runs",
        )
    } == {
        "name": "nightly",
        "jarId": jar,
        "entryClass": "build",
        "cron": "0 3 * * *",
        "everySeconds": None,
        "overlap": "skip",
        "misfireGraceSeconds": 60,
        "enabled": False,
        "nextFire": None,
        "lastFire": None,
        "lastJobId": None,
        "lastOutcome": None,
        "runs": 0,
    }
    resumed = rest.http.patch(f"/jobs/schedules/{sid}", json={"enabled": True}).json()
    assert resumed["enabled"] and resumed["nextFire"] % 86_400_000 == 3 * 3_600_000 and resumed["history"] == []
    r = rest.http.delete(f"/jars/{jar}")  # its schedule would only record skipped runs
    assert r.status_code == 409 and sid in r.json()["errors"][0] and "headrace schedule delete" in r.json()["hint"]
    assert rest.http.delete(f"/jobs/schedules/{sid}").status_code == 200
    assert rest.http.get(f"/jobs/schedules/{sid}").status_code == 404


def test_cli_create_list_pause_delete(cluster, jar):
    runner = CliRunner()
    url = ["-m", cluster.dispatcher_url]
    out = runner.invoke(
        cli.app,
        [
            "schedule",
            "create",
            "--jar",
            jar,
            "--cron",
            "*/30 * * * *",
            "--kind",
            "noop",
            "--name",
            "from-cli",
            "--overlap",
            "queue",
            *url,
            "--",
            "--day",
            "today",
        ],
    )
    assert out.exit_code == 0, out.output
    sid = out.output.split()[1]
    assert "cron */30 * * * * UTC" in out.output
    listed = runner.invoke(cli.app, ["schedule", "list", *url])
    assert listed.exit_code == 0 and sid in listed.output and "from-cli" in listed.output and "queue" in listed.output
    assert runner.invoke(cli.app, ["schedule", "pause", sid, *url]).exit_code == 0
    assert "paused" in runner.invoke(cli.app, ["schedule", "list", *url]).output
    bad = runner.invoke(cli.app, ["schedule", "create", "--jar", jar, "--cron", "* * 32 * *", *url])
    assert bad.exit_code == 1 and "day-of-month" in bad.output and "Traceback" not in bad.output
    both = runner.invoke(cli.app, ["schedule", "create", "--jar", jar, *url])
    assert both.exit_code == 2 and "exactly one of --cron" in both.output
    assert runner.invoke(cli.app, ["schedule", "delete", sid, *url]).exit_code == 0
    gone = runner.invoke(cli.app, ["schedule", "show", sid, *url])
    assert gone.exit_code == 1 and "not found" in gone.output


def test_overlap_skip_while_the_previous_run_never_ends(rest, jar, catalog):
    sid = create(rest, jarId=jar, kind="noop", everySeconds=EVERY_S, overlap="skip", config={"noop.duration": -1})
    wait_for("three ticks of the endless schedule", lambda: len(runs(catalog, sid)) >= 3, timeout_s=20)
    rest.http.delete(f"/jobs/schedules/{sid}")
    recorded = runs(catalog, sid)
    [(_, first, job_id)] = recorded[:1]
    assert first == "submitted" and {o for _, o, _ in recorded[1:]} == {"skipped_overlap"}, recorded
    rest.wait_attempt_running(job_id, 0)
    with catalog.session() as s:
        assert s.execute(select(func.count()).select_from(Job).where(Job.schedule_id == sid)).scalar_one() == 1
    rest.cancel(job_id)
    rest.wait_state(job_id, "CANCELED", timeout_s=30)


def test_one_run_per_tick_across_a_kill_9_of_the_leader(cluster, rest, jar, catalog):
    sid = create(
        rest,
        jarId=jar,
        kind="noop",
        everySeconds=EVERY_S,
        name="every-2s",
        overlap="skip",
        config={"noop.duration": 0.1},
        restartStrategy={"type": "none"},
    )
    wait_for("three runs before the failover", lambda: len(submitted(catalog, sid)) >= 3, timeout_s=30)
    before = leader(cluster)
    name = leader_child(cluster)
    standby = next(c for c in cluster.children if c.name.startswith("jobmanager") and c.name != name)
    # Nobody leads for a while: the standby is frozen when the leader dies, and woken later.
    os.kill(standby.proc.pid, signal.SIGSTOP)
    try:
        os.killpg(cluster.child(name).proc.pid, signal.SIGKILL)
        cluster.child(name).proc.wait(30)
        killed_at_ms = runs(catalog, sid)[-1][0]
        time.sleep(OUTAGE_S)
    finally:
        os.kill(standby.proc.pid, signal.SIGCONT)
    wait_for(
        "three runs by the new leader",
        lambda: len([t for t, o, _ in runs(catalog, sid) if o == "submitted" and t > killed_at_ms]) >= 3,
        timeout_s=40,
    )
    assert rest.http.patch(f"/jobs/schedules/{sid}", json={"enabled": False}).status_code == 200
    after = leader(cluster)
    assert after["id"] != before["id"] and after["epoch"] > before["epoch"]

    recorded = runs(catalog, sid)
    ticks = [t for t, _, _ in recorded]
    # Exactly once per tick: no tick twice, none missing between the first and the last.
    assert len(ticks) == len(set(ticks))
    assert ticks == list(range(ticks[0], ticks[-1] + 1, EVERY_S * 1000)), recorded
    # The ticks missed while nobody led are recorded as misfires, and only those.
    misfired = [t for t, o, _ in recorded if o == "skipped_misfire"]
    assert misfired and all(killed_at_ms < t < killed_at_ms + (OUTAGE_S + 15) * 1000 for t in misfired), recorded
    # The newest missed tick was handled once by the new leader: run, or skipped because the run
    # the dead leader had just started was not over yet (overlap skip).
    first_after = next((t, o) for t, o, _ in recorded if t > misfired[-1])
    assert first_after[0] == misfired[-1] + EVERY_S * 1000 and first_after[1] in ("submitted", "skipped_overlap")
    assert {o for _, o, _ in recorded} <= {"submitted", "skipped_misfire", "skipped_overlap"}, recorded
    # Every run is a normal job linked to its schedule, and no job of the schedule is not a run.
    jobs = submitted(catalog, sid)
    with catalog.session() as s:
        linked = set(s.execute(select(Job.id).where(Job.schedule_id == sid)).scalars())
    assert linked == set(jobs) and len(jobs) >= 6
    for job_id in jobs:
        assert rest.wait_state(job_id, TERMINAL, timeout_s=30)["state"] == "FINISHED"
    detail = rest.get(f"/jobs/schedules/{sid}")
    assert detail["runs"] == len(recorded) and detail["lastJobId"] == jobs[-1]
    assert [h["tick"] for h in detail["history"]] == sorted(ticks, reverse=True)[:50]
    cluster.respawn(name)  # back as the standby
