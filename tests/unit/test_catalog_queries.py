"""The repository's read functions that the services' own queries became (issue 45: one door to
the catalog), against a real catalog at the migrations' head: each answers what the service's
query answered (same filters, order, limits and locks). SQLite here; tests/integration/
test_catalog_queries_pg.py runs the same tests on PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.models import Execution
from shared.catalog.repository import deployments as deployments_repo
from shared.states import CheckpointStatus as CS
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS
from shared.states import Lifecycle

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
MODE = "execution.runtime-mode"


@pytest.fixture
def catalog_url(migrated_sqlite_url):
    return migrated_sqlite_url


@pytest.fixture
def catalog(catalog_url):
    c = Catalog(catalog_url)
    with c.session() as s:
        seed(s)
    yield c
    c.dispose()


def _job(s, job_id: str, *, epoch: int, config: dict | None = None, statuses=()):
    job = repo.create_job(
        s,
        id=job_id,
        name=job_id,
        artifact_id="jar-1",
        entry="build",
        parallelism=1,
        program_args=[],
        config=config or {},
        restart_strategy={},
    )
    for st in statuses:
        repo.transition_job(s, job, st)
    job.epoch = epoch
    return job


def _execution(s, ex_id: str, job_id: str, vertex_id: str, attempt: int, state: ES, **columns) -> Execution:
    ex = repo.create_execution(s, id=ex_id, job_id=job_id, vertex_id=vertex_id, attempt=attempt)
    ex.state = state.value  # seeded as it would stand, without walking the machine
    for name, value in columns.items():
        setattr(ex, name, value)
    return ex


def _checkpoint(
    s,
    job_id: str,
    cid: int,
    status: CS,
    *,
    path: str | None = None,
    execution_id: str | None = None,
    kind: str = "checkpoint",
    ack_at: datetime | None = None,
    trigger_at: datetime | None = None,
    duration_ms: int | None = None,
    state_size: int | None = None,
):
    row = repo.create_checkpoint(
        s, job_id=job_id, checkpoint_id=cid, kind=kind, execution_id=execution_id, vertex_id=None, path=path
    )
    row.status, row.ack_at, row.duration_ms, row.state_size = status.value, ack_at, duration_ms, state_size
    if trigger_at is not None:
        row.trigger_at = trigger_at
    return row


def seed(s) -> None:
    """Job A runs (restarted once), B failed, C was just submitted; A has two vertices."""
    repo.create_artifact(s, id="jar-1", name="p.py", path="/jars/p.py", size=1, sha256="0" * 64)
    repo.create_artifact(s, id="jar-2", name="q.py", path="/jars/q.py", size=1, sha256="0" * 64)
    _job(s, "job-a", epoch=3, config={MODE: "STREAMING"}, statuses=(JS.CREATED, JS.RUNNING, JS.RESTARTING, JS.RUNNING))
    _job(s, "job-b", epoch=5, statuses=(JS.FAILED,))
    _job(s, "job-c", epoch=0)
    repo.create_vertex(s, id="va0", job_id="job-a", name="a0", parallelism=2, idx=0)
    repo.create_vertex(s, id="va1", job_id="job-a", name="a1", parallelism=1, idx=1)
    repo.create_vertex(s, id="vb0", job_id="job-b", name="b0", parallelism=1, idx=0)
    s.flush()
    _execution(
        s,
        "ex-a0-0",
        "job-a",
        "va0",
        0,
        ES.FAILED,
        end_at=T0 + timedelta(seconds=10),
        failure_cause="TaskFailure: boom",
        allocation_id="alloc-1",
    )
    _execution(s, "ex-a0-1", "job-a", "va0", 1, ES.RUNNING, allocation_id="alloc-2")
    _execution(s, "ex-a1-0", "job-a", "va1", 0, ES.DEPLOYING, allocation_id="alloc-2")
    _execution(s, "ex-b0-0", "job-b", "vb0", 0, ES.CANCELING)
    _execution(s, "ex-b0-1", "job-b", "vb0", 1, ES.FAILED, end_at=T0 - timedelta(seconds=10))
    s.flush()
    _checkpoint(
        s,
        "job-a",
        1,
        CS.COMPLETED,
        path="/chk/a/1",
        execution_id="ex-a0-1",
        ack_at=T0,
        duration_ms=100,
        state_size=10,
        trigger_at=T0,
    )
    _checkpoint(
        s,
        "job-a",
        2,
        CS.COMPLETED,
        execution_id="ex-a0-1",
        ack_at=T0 + timedelta(seconds=5),
        duration_ms=300,
        state_size=30,
    )
    _checkpoint(s, "job-a", 3, CS.IN_PROGRESS, path="/chk/a/3")
    _checkpoint(s, "job-a", 4, CS.FAILED)
    _checkpoint(
        s,
        "job-b",
        1,
        CS.COMPLETED,
        path="/sp/b/1",
        kind="savepoint",
        ack_at=T0 + timedelta(seconds=9),
        trigger_at=T0 - timedelta(seconds=1),
    )
    _checkpoint(s, "job-c", 1, CS.IN_PROGRESS, path="/chk/a/1", trigger_at=T0 + timedelta(seconds=1))
    repo.record_exception(s, job_id="job-a", exception_name="First", stacktrace="1")
    repo.record_exception(s, job_id="job-a", exception_name="Second", stacktrace="2")
    repo.add_outbox(s, [dict(id=f"o{i}", seq=i, kind="redis", target="q", envelope="{}") for i in (1, 2)])
    repo.create_schedule(
        s,
        id="sch-due",
        name="due",
        artifact_id="jar-1",
        entry="build",
        kind="noop",
        enabled=True,
        next_fire_at=T0 - timedelta(seconds=1),
    )
    repo.create_schedule(
        s, id="sch-now", name="now", artifact_id="jar-1", entry="build", kind="noop", enabled=True, next_fire_at=T0
    )
    repo.create_schedule(
        s,
        id="sch-later",
        name="later",
        artifact_id="jar-1",
        entry="build",
        kind="noop",
        enabled=True,
        next_fire_at=T0 + timedelta(seconds=1),
    )
    repo.create_schedule(
        s,
        id="sch-paused",
        name="paused",
        artifact_id="jar-1",
        entry="build",
        kind="noop",
        enabled=False,
        next_fire_at=T0 - timedelta(seconds=1),
    )
    repo.create_schedule(
        s, id="sch-none", name="none", artifact_id="jar-1", entry="build", kind="noop", enabled=True, next_fire_at=None
    )
    for name in ("d2", "d1"):
        row, _ = deployments_repo.put_deployment(s, name, {"jarId": "jar-1"})
        deployments_repo.record_deployment_event(s, row, from_state=None, to_state="STABLE", reason="deployed")
    d1 = deployments_repo.get_deployment(s, "d1")
    for reason in ("autoscaler: scale-up to 2", "autoscaler: scale-down to 1", "autoscaler: held"):
        deployments_repo.record_deployment_event(s, d1, from_state="STABLE", to_state="STABLE", reason=reason)


def test_jobs(catalog):
    with catalog.session() as s:
        assert repo.newest_job_epoch(s) == 5
        assert repo.find_job(s, "job-a").id == "job-a" and repo.find_job(s, "job-x") is None
        assert repo.job_statuses(s, ["job-a", "job-b", "job-x"]) == {"job-a": "RUNNING", "job-b": "FAILED"}
        assert repo.job_statuses(s, []) == {}
        rows = repo.job_overview_rows(s, MODE)
        assert [(r[0], r[2], r[6]) for r in rows] == [
            ("job-c", "INITIALIZING", None),
            ("job-b", "FAILED", None),
            ("job-a", "RUNNING", "STREAMING"),
        ]  # newest first
        assert repo.count_transitions_to(s, JS.RESTARTING) == 1
        assert repo.count_transitions_to(s, JS.RUNNING) == 2
        assert repo.count_transitions_to(s, JS.CANCELED) == 0
        newest = repo.newest_exception(s, "job-a")
        assert newest is not None and newest.exception_name == "Second"
        assert repo.newest_exception(s, "job-b") is None


def test_empty_catalog(catalog_url):
    catalog = Catalog(catalog_url)
    try:
        with catalog.session() as s:
            assert repo.newest_job_epoch(s) == 0
            assert repo.count_restarted_attempts(s) == 0 and repo.count_outbox(s) == 0
            assert repo.max_checkpoint_id(s, "job-x") == 0
            assert repo.newest_completed_of_running_jobs(s) == []
    finally:
        catalog.dispose()


def test_executions(catalog):
    with catalog.session() as s:
        assert repo.find_execution(s, "ex-a0-1").attempt == 1 and repo.find_execution(s, "ex-x") is None
        assert repo.find_vertex(s, "va1").idx == 1 and repo.find_vertex(s, "vx") is None
        assert sorted(v.id for v in repo.vertices_of_jobs(s, ["job-a", "job-x"])) == ["va0", "va1"]
        assert sorted(e.id for e in repo.executions_in_states(s, [ES.DEPLOYING, ES.CANCELING])) == [
            "ex-a1-0",
            "ex-b0-0",
        ]
        assert sorted(repo.allocation_holder_states(s, "alloc-2")) == ["DEPLOYING", "RUNNING"]
        assert list(repo.allocation_holder_states(s, "alloc-x")) == []
        assert [e.id for e in repo.failed_executions_since(s, "job-a", T0)] == ["ex-a0-0"]
        assert repo.failed_executions_since(s, "job-a", T0 + timedelta(seconds=11)) == []
        assert repo.failed_executions_since(s, "job-b", T0) == []  # it failed before
        assert [tuple(r) for r in repo.vertex_ids_by_job(s)] == [("va0", "job-a"), ("va1", "job-a"), ("vb0", "job-b")]
        latest = {r.vertex_id: (r.state, r.attempt) for r in repo.latest_attempt_states(s)}
        assert latest == {"va0": ("RUNNING", 1), "va1": ("DEPLOYING", 0), "vb0": ("FAILED", 1)}
        assert repo.count_executions_by_state(s) == {"FAILED": 2, "RUNNING": 1, "DEPLOYING": 1, "CANCELING": 1}
        assert repo.count_restarted_attempts(s) == 2


def test_checkpoints_of_many_jobs(catalog, monkeypatch):
    from shared.catalog.repository import checkpoints

    monkeypatch.setattr(checkpoints, "CHUNK", 1)  # one query per job: the chunks add up
    with catalog.session() as s:
        rows = repo.completed_checkpoints_of(s, ["job-a", "job-b", "job-c"])
        assert sorted((r.job_id, r.checkpoint_id) for r in rows) == [("job-a", 1), ("job-a", 2), ("job-b", 1)]
        pointers = repo.completed_pointer_rows(s, ["job-a", "job-b", "job-c"])
        assert sorted(tuple(r) for r in pointers) == [
            ("job-a", 1, "/chk/a/1", "checkpoint", None),
            ("job-a", 2, None, "checkpoint", None),
            ("job-b", 1, "/sp/b/1", "savepoint", None),
        ]
        assert repo.completed_checkpoints_of(s, []) == []


def test_checkpoints_of_one_job(catalog):
    with catalog.session() as s:
        assert repo.max_checkpoint_id(s, "job-a") == 4  # any status
        assert repo.count_job_checkpoints_by_status(s, "job-a") == {"COMPLETED": 2, "IN_PROGRESS": 1, "FAILED": 1}
        assert repo.newest_snapshot_path(s, "job-a") == "/chk/a/1"  # the newest completed one with a path
        assert repo.newest_snapshot_path(s, "job-c") is None  # in progress only
        ack = repo.newest_checkpoint_ack(s, "job-a")
        assert ack is not None and ack.replace(tzinfo=timezone.utc) == T0 + timedelta(seconds=5)
        assert repo.newest_checkpoint_ack(s, "job-b") is None  # its only one has no attempt


def test_snapshots_by_path(catalog):
    with catalog.session() as s:
        assert repo.snapshot_owner(s, ["/chk/a/1", "/nowhere"], other_than="job-x") == "job-a"  # triggered first
        assert repo.snapshot_owner(s, ["/chk/a/1"], other_than="job-a") == "job-c"
        assert repo.snapshot_owner(s, ["/sp/b/1"], other_than="job-b") is None
        assert repo.is_completed_snapshot(s, ["/x", "/sp/b/1"])
        assert not repo.is_completed_snapshot(s, ["/chk/a/3"])  # in progress
        locked = repo.lock_completed_snapshots(s, ["/chk/a/1", "/chk/a/3", "/sp/b/1"])
        assert sorted((r.job_id, r.checkpoint_id) for r in locked) == [("job-a", 1), ("job-b", 1)]


def test_checkpoint_figures(catalog):
    with catalog.session() as s:
        assert sorted(tuple(r) for r in repo.count_checkpoints_by_kind_and_status(s)) == [
            ("checkpoint", "COMPLETED", 2),
            ("checkpoint", "FAILED", 1),
            ("checkpoint", "IN_PROGRESS", 2),
            ("savepoint", "COMPLETED", 1),
        ]
        assert sorted(tuple(r) for r in repo.completed_durations_by_kind(s)) == [
            ("checkpoint", 2, 400),
            ("savepoint", 0, 0),
        ]
        # job-b has a newer completed one but is not RUNNING
        assert [tuple(r) for r in repo.newest_completed_of_running_jobs(s)] == [("job-a", 300, 30)]


def test_artifacts_outbox_schedules(catalog):
    with catalog.session() as s:
        assert repo.find_artifact(s, "jar-1").name == "p.py" and repo.find_artifact(s, "jar-x") is None
        assert sorted(a.id for a in repo.artifacts_by_ids(s, {"jar-1", "jar-x"})) == ["jar-1"]
        repo.set_artifact_listing(s, "jar-1", {"modules": ["p"]})
        repo.set_artifact_listing(s, "jar-x", {"modules": []})  # gone: nothing to record
    with catalog.session() as s:
        repo.set_artifact_listing(s, "jar-1", {"modules": ["other"]})  # has one already: kept
    with catalog.session() as s:
        assert repo.get_artifact(s, "jar-1").listing == {"modules": ["p"]}
        assert repo.count_outbox(s) == 2
        assert sorted(repo.due_schedule_ids(s, T0)) == ["sch-due", "sch-now"]


def test_deployments(catalog):
    with catalog.session() as s:
        desired = deployments_repo.desired_states(s)
        assert [r.name for r in desired] == ["d1", "d2"]
        assert [len(tuple(r)) for r in desired] == [len(deployments_repo.DESIRED_FIELDS)] * 2
        assert desired[0].generation == 1 and desired[0].lifecycle is None
        assert sorted(tuple(r) for r in deployments_repo.count_autoscaler_rescales(s)) == [("d1", 2)]


def test_transition_deployment_writes_the_lifecycle(catalog):
    with catalog.session() as s:
        row = deployments_repo.get_deployment(s, "d1", lock=True)
        deployments_repo.transition_deployment(s, row, Lifecycle.DEPLOYING)
    with catalog.session() as s:
        row = deployments_repo.get_deployment(s, "d1", lock=True)
        assert row.lifecycle == "DEPLOYING"
        with pytest.raises(repo.IllegalTransition):
            deployments_repo.transition_deployment(s, row, Lifecycle.UPGRADING)
        assert row.lifecycle == "DEPLOYING"
