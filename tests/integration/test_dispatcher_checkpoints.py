"""The checkpoint and savepoint endpoints against a real catalog (SQLite and PostgreSQL), on the
in-memory transport: the messages the JobManager is sent, the operation rows, Flink 2.3's field
names in every answer, and the statistics computed from checkpoint rows written with the
repository functions the JobManager uses. Snapshots on disk are real ones (shared.checkpoint_storage).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from services.dispatcher.app import create_app
from shared import checkpoint_storage
from shared.catalog import repository
from shared.catalog.models import Operation
from shared.ids import new_request_id
from shared.messages import RequestCheckpoint, RequestSavepoint
from shared.settings import Settings
from shared.states import CheckpointStatus as CS
from shared.states import JobStatus as J
from shared.states import OperationStatus as OS
from shared.streams import JM_STREAM
from shared.transport import InMemoryTransport
from tests.integration.dispatcher_support import (  # noqa: F401 - fixtures and their dependencies
    catalog,
    catalog_url,
    client,
    deploy,
    schedule,
    submit,
    transport,
    upload,
)

TRIGGER_KEYS = {"request-id"}


@pytest.fixture
def settings(tmp_path, catalog_url) -> Settings:
    # The directories these tests name as savepoint targets and snapshot locations are storage
    # roots, as an operator lists them; /etc and the like stay outside.
    return Settings(
        home=tmp_path / "home",
        catalog_url=catalog_url,
        restart_strategy={"type": "fixed-delay", "attempts": 3, "delay": 1.0},
        storage_roots=["/data/sp", "/srv/sp", "/sp", str(tmp_path / "roots")],
    )


def running_job(client, catalog, body: dict | None = None) -> tuple[str, str, str]:
    job_id = submit(client, upload(client)["id"], body)
    vertex_id, ex_id = schedule(catalog, job_id)
    deploy(catalog, job_id, ex_id)
    return job_id, vertex_id, ex_id


def operation(catalog, request_id):
    with catalog.session() as s:
        return repository.get_operation(s, request_id)


def finish_op(catalog, request_id, status, **kw) -> None:
    with catalog.session() as s:
        repository.finish_operation(s, repository.get_operation(s, request_id, lock=True), status, **kw)


def snapshot(path: Path, job_id: str = "0" * 32) -> Path:
    """A real completed snapshot directory (an empty one: no Spark state is needed here)."""
    checkpoint_storage.take_empty_snapshot(path, metadata={"job_id": job_id, "kind": "savepoint", "checkpoint_id": 1})
    return path


def add_checkpoint(
    catalog,
    job_id,
    cid,
    *,
    status=CS.COMPLETED,
    kind="checkpoint",
    size=1000,
    duration=100,
    path=None,
    after="continue",
    cause=None,
    ex_id=None,
    vertex_id=None,
):
    with catalog.session() as s:
        row = repository.create_checkpoint(
            s, job_id=job_id, checkpoint_id=cid, kind=kind, execution_id=ex_id, vertex_id=vertex_id, after=after
        )
        if status in (CS.COMPLETED, CS.DISCARDED):
            repository.transition_checkpoint(
                s,
                row,
                CS.COMPLETED,
                path=path or f"/chk/{job_id}/chk-{cid}",
                batch_id=cid * 10,
                state_size=size,
                duration_ms=duration,
                source_offsets=[{"source": cid}],
            )
            if status == CS.DISCARDED:
                repository.transition_checkpoint(s, row, CS.DISCARDED)
        elif status == CS.FAILED:
            repository.transition_checkpoint(s, row, CS.FAILED, failure_cause=cause or "declined", duration_ms=duration)


# --- savepoints --------------------------------------------------------------------------------


def test_savepoint_trigger_records_the_operation_and_asks_the_jobmanager(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    # The body the real `flink savepoint` CLI 2.3 sends (nulls included).
    r = client.post(
        f"/jobs/{job_id}/savepoints",
        json={"target-directory": "file:///data/sp", "cancel-job": True, "formatType": "NATIVE", "triggerId": None},
    )
    assert r.status_code == 202 and set(r.json()) == TRIGGER_KEYS
    rid = r.json()["request-id"]
    assert transport.bodies(JM_STREAM)[-1] == RequestSavepoint(
        job_id=job_id, request_id=rid, target_directory="/data/sp", after="cancel"
    )
    op = operation(catalog, rid)
    assert (op.kind, op.job_id, op.status) == ("savepoint", job_id, "IN_PROGRESS")
    assert op.params == {"target_directory": "/data/sp", "after": "cancel", "drain": False, "format_type": "NATIVE"}

    status = client.get(f"/jobs/{job_id}/savepoints/{rid}")
    assert status.status_code == 200 and status.json() == {"status": {"id": "IN_PROGRESS"}, "operation": None}
    finish_op(catalog, rid, OS.COMPLETED, location="/data/sp/savepoint-abcdef-0123456789ab", checkpoint_id=4)
    assert client.get(f"/jobs/{job_id}/savepoints/{rid}").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {"location": "file:/data/sp/savepoint-abcdef-0123456789ab"},
    }


def test_a_failed_savepoint_is_completed_with_its_cause(client, catalog):
    job_id, _, _ = running_job(client, catalog)
    rid = client.post(f"/jobs/{job_id}/savepoints", json={}).json()["request-id"]
    finish_op(catalog, rid, OS.FAILED, failure_cause="checkpoint 3 declined: the query stopped")
    body = client.get(f"/jobs/{job_id}/savepoints/{rid}").json()
    assert body["status"] == {"id": "COMPLETED"} and set(body["operation"]) == {"failure-cause"}
    cause = body["operation"]["failure-cause"]
    assert set(cause) == {"class", "stack-trace", "serialized-throwable"}
    assert cause["stack-trace"] == "checkpoint 3 declined: the query stopped" and cause["class"].endswith("Exception")


def test_savepoint_target_defaults_to_the_jobs_then_the_clusters_directory(client, catalog, transport, settings):
    job_id, _, _ = running_job(client, catalog, {"flinkConfiguration": {"state.savepoints.dir": "file:/srv/sp"}})
    client.post(f"/jobs/{job_id}/savepoints")  # no body at all, as curl -X POST sends
    assert transport.bodies(JM_STREAM)[-1].target_directory == "/srv/sp"
    other, _, _ = running_job(client, catalog)
    client.post(f"/jobs/{other}/savepoints", json={"cancel-job": False})
    assert transport.bodies(JM_STREAM)[-1].target_directory == str(settings.savepoints.absolute())


def test_a_trigger_id_never_triggers_twice(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    tid = new_request_id()
    first = client.post(f"/jobs/{job_id}/savepoints", json={"triggerId": tid})
    again = client.post(f"/jobs/{job_id}/savepoints", json={"triggerId": tid.upper()})
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json() == {"request-id": tid}
    assert sum(isinstance(b, RequestSavepoint) for b in transport.bodies(JM_STREAM)) == 1
    r = client.post(f"/jobs/{job_id}/checkpoints", json={"triggerId": tid})
    assert r.status_code == 409 and r.json()["field"] == "triggerId"
    r = client.post(f"/jobs/{job_id}/savepoints", json={"triggerId": "not-hex"})
    assert r.status_code == 400 and r.json()["field"] == "triggerId"


def test_stop_with_savepoint_is_polled_at_the_savepoint_resource(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    # The body the real `flink stop --savepointPath /data/sp -d` sends.
    r = client.post(
        f"/jobs/{job_id}/stop",
        json={"targetDirectory": "/data/sp", "drain": True, "formatType": "CANONICAL", "triggerId": None},
    )
    assert r.status_code == 202 and set(r.json()) == TRIGGER_KEYS
    rid = r.json()["request-id"]
    assert transport.bodies(JM_STREAM)[-1] == RequestSavepoint(
        job_id=job_id, request_id=rid, target_directory="/data/sp", after="stop", drain=True
    )
    assert operation(catalog, rid).kind == "stop"
    finish_op(catalog, rid, OS.COMPLETED, location="/data/sp/savepoint-abcdef-0123456789ab")
    assert client.get(f"/jobs/{job_id}/savepoints/{rid}").json()["operation"] == {
        "location": "file:/data/sp/savepoint-abcdef-0123456789ab"
    }


BAD_TRIGGER_BODIES = [
    ("savepoints", {"target-directory": "s3://bucket/sp"}, "target-directory", "scheme 's3' is not supported"),
    ("savepoints", {"target-directory": "relative/sp"}, "target-directory", "absolute path"),
    ("savepoints", {"target-directory": "file://host/sp"}, "target-directory", "not an absolute file:// URI"),
    ("savepoints", {"cancel-job": "maybe"}, "cancel-job", "true or false"),
    ("savepoints", {"formatType": "BINARY"}, "formatType", "CANONICAL, NATIVE"),
    ("savepoints", {"targetDirectory": "/x"}, "targetDirectory", "unknown field"),
    ("stop", {"targetDirectory": "hdfs:///sp"}, "targetDirectory", "scheme 'hdfs' is not supported"),
    ("stop", {"target-directory": "/x"}, "target-directory", "unknown field"),
    ("checkpoints", {"checkpointType": "DELTA"}, "checkpointType", "CONFIGURED, FULL, INCREMENTAL"),
]


def test_bad_trigger_bodies_are_400_naming_the_field(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    published = len(transport.bodies(JM_STREAM))
    for path, body, field, fragment in BAD_TRIGGER_BODIES:
        r = client.post(f"/jobs/{job_id}/{path}", json=body)
        assert r.status_code == 400, (path, body, r.text)
        assert r.json()["field"] == field and fragment in r.json()["errors"][0], (path, body, r.json())
    assert len(transport.bodies(JM_STREAM)) == published
    with catalog.session() as s:
        assert repository.job_operations(s, job_id) == []


def test_unknown_and_terminal_jobs(client, catalog, transport):
    for path in ("savepoints", "stop", "checkpoints"):
        r = client.post(f"/jobs/{'0' * 32}/{path}", json={})
        assert r.status_code == 404 and r.json()["field"] == "jobid", r.text
    assert client.patch(f"/jobs/{'0' * 32}/rescaling", params={"parallelism": 2}).status_code == 404
    job_id, _, ex_id = running_job(client, catalog)
    with catalog.session() as s:
        repository.transition_job(s, job_id, J.CANCELLING, epoch=1)
        repository.transition_job(s, job_id, J.CANCELED, epoch=1)
    published = len(transport.bodies(JM_STREAM))
    r = client.post(f"/jobs/{job_id}/savepoints", json={})
    assert r.status_code == 409
    assert r.json()["errors"] == [
        f"job {job_id} cannot take a savepoint: it has already reached the terminal state CANCELED"
    ]
    assert client.post(f"/jobs/{job_id}/stop", json={}).status_code == 409
    assert client.post(f"/jobs/{job_id}/checkpoints", json={}).status_code == 409
    assert client.patch(f"/jobs/{job_id}/rescaling", params={"parallelism": 2}).status_code == 409
    assert len(transport.bodies(JM_STREAM)) == published


def test_a_rescale_beyond_the_jobs_state_partitions_is_refused_before_anything_is_recorded(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    published = len(transport.bodies(JM_STREAM))
    r = client.patch(f"/jobs/{job_id}/rescaling", params={"parallelism": 5})  # the cluster's default: 4
    assert r.status_code == 400, r.text
    assert r.json()["errors"] == [
        f"job {job_id} has 4 state partitions, fixed at its first start: parallelism 5 could not use more than 4 cores"
    ]
    assert "pipeline.max-parallelism >= 5" in r.text
    assert len(transport.bodies(JM_STREAM)) == published
    with catalog.session() as s:
        assert repository.job_operations(s, job_id) == []
    assert client.patch(f"/jobs/{job_id}/rescaling", params={"parallelism": 4}).status_code == 200


def test_unknown_request_ids_are_404(client, catalog):
    job_id, _, _ = running_job(client, catalog)
    other, _, _ = running_job(client, catalog)
    ck = client.post(f"/jobs/{job_id}/checkpoints", json={}).json()["request-id"]
    sp = client.post(f"/jobs/{other}/savepoints", json={}).json()["request-id"]
    for url in (
        f"/jobs/{job_id}/savepoints/{'f' * 32}",
        f"/jobs/{job_id}/savepoints/{ck}",  # a checkpoint's id
        f"/jobs/{job_id}/savepoints/{sp}",  # another job's savepoint
        f"/jobs/{job_id}/checkpoints/{sp}",
        f"/jobs/{job_id}/rescaling/{sp}",
        f"/savepoint-disposal/{sp}",
        f"/jobs/{job_id}/savepoints/%00",
    ):
        r = client.get(url)
        assert r.status_code == 404, (url, r.text)
        assert r.json()["field"] == "triggerid" and "There is no" in r.json()["errors"][0]
    assert client.get(f"/jobs/{'0' * 32}/savepoints/{sp}").json()["field"] == "jobid"


def test_an_unreachable_jobmanager_stream_fails_the_operation(settings, catalog):
    class Down(InMemoryTransport):
        def publish(self, stream, body, *, epoch=None):
            if isinstance(body, (RequestSavepoint, RequestCheckpoint)):
                raise ConnectionError("redis is down")
            return super().publish(stream, body, epoch=epoch)

    with TestClient(create_app(settings, catalog, Down())) as client:
        job_id, _, _ = running_job(client, catalog)
        r = client.post(f"/jobs/{job_id}/savepoints", json={})
        assert r.status_code == 503 and "unreachable" in r.json()["errors"][0]
        with catalog.session() as s:
            [op] = repository.job_operations(s, job_id)
        assert op.status == "FAILED" and "could not publish RequestSavepoint" in op.failure_cause
        body = client.get(f"/jobs/{job_id}/savepoints/{op.id}").json()
        assert "redis is down" in body["operation"]["failure-cause"]["stack-trace"]


# --- rescaling ---------------------------------------------------------------------------------


def test_rescaling_is_a_savepoint_then_a_restart(client, catalog, transport, settings):
    job_id, _, _ = running_job(client, catalog)
    r = client.patch(f"/jobs/{job_id}/rescaling", params={"parallelism": 3})
    assert r.status_code == 200 and set(r.json()) == TRIGGER_KEYS  # Flink answers this trigger with 200
    rid = r.json()["request-id"]
    assert transport.bodies(JM_STREAM)[-1] == RequestSavepoint(
        job_id=job_id,
        request_id=rid,
        target_directory=str(settings.savepoints.absolute()),
        after="rescale",
        parallelism=3,
    )
    op = operation(catalog, rid)
    assert op.kind == "rescale" and op.params["parallelism"] == 3
    assert client.get(f"/jobs/{job_id}/rescaling/{rid}").json() == {"status": {"id": "IN_PROGRESS"}, "operation": None}
    finish_op(catalog, rid, OS.COMPLETED, location="/sp/savepoint-x", checkpoint_id=9)
    assert client.get(f"/jobs/{job_id}/rescaling/{rid}").json() == {"status": {"id": "COMPLETED"}, "operation": {}}


def test_rescaling_needs_a_positive_int_parallelism(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    published = len(transport.bodies(JM_STREAM))
    for params in (
        {"parallelism": 0},
        {"parallelism": -1},
        {"parallelism": 2**31},
        {"parallelism": 2**63},
        {"parallelism": "two"},
        {"parallelism": "1.5"},
        {},
    ):
        r = client.patch(f"/jobs/{job_id}/rescaling", params=params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["field"] == "parallelism", params
    assert len(transport.bodies(JM_STREAM)) == published


# --- manual checkpoints ------------------------------------------------------------------------


def test_manual_checkpoint_trigger_and_status(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    r = client.post(f"/jobs/{job_id}/checkpoints", json={"checkpointType": "full", "triggerId": None})
    assert r.status_code == 202 and set(r.json()) == TRIGGER_KEYS
    rid = r.json()["request-id"]
    assert transport.bodies(JM_STREAM)[-1] == RequestCheckpoint(job_id=job_id, request_id=rid)
    op = operation(catalog, rid)
    assert (op.kind, op.params) == ("checkpoint", {"checkpoint_type": "FULL"})
    assert client.get(f"/jobs/{job_id}/checkpoints/{rid}").json()["status"] == {"id": "IN_PROGRESS"}
    finish_op(catalog, rid, OS.COMPLETED, checkpoint_id=12, location="/chk/x/chk-12")
    assert client.get(f"/jobs/{job_id}/checkpoints/{rid}").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {"checkpointId": 12},
    }
    rid = client.post(f"/jobs/{job_id}/checkpoints").json()["request-id"]
    finish_op(catalog, rid, OS.FAILED, failure_cause="checkpoint 13 expired before completing")
    assert set(client.get(f"/jobs/{job_id}/checkpoints/{rid}").json()["operation"]) == {"failureCause"}


# --- statistics, details, configuration -------------------------------------------------------


def test_checkpoint_statistics_from_the_catalog(client, catalog):
    job_id, vertex_id, ex_id = running_job(client, catalog)
    empty = client.get(f"/jobs/{job_id}/checkpoints").json()
    assert empty["counts"] == {"restored": 0, "total": 0, "in_progress": 0, "completed": 0, "failed": 0}
    assert empty["latest"] == {"completed": None, "savepoint": None, "failed": None, "restored": None}
    assert empty["history"] == []

    add_checkpoint(catalog, job_id, 1, status=CS.DISCARDED, size=1000, duration=100)
    add_checkpoint(catalog, job_id, 2, size=2000, duration=300, ex_id=ex_id, vertex_id=vertex_id)
    add_checkpoint(catalog, job_id, 3, status=CS.FAILED, cause="checkpoint 3 declined: the query stopped")
    add_checkpoint(
        catalog,
        job_id,
        4,
        kind="savepoint",
        size=4000,
        duration=500,
        after="continue",
        path="/sp/savepoint-abcdef-0123456789ab",
    )
    add_checkpoint(catalog, job_id, 5, status=CS.IN_PROGRESS)
    body = client.get(f"/jobs/{job_id}/checkpoints").json()
    assert body["counts"] == {"restored": 0, "total": 5, "in_progress": 1, "completed": 3, "failed": 1}
    assert set(body["summary"]) == {
        "checkpointed_size",
        "state_size",
        "end_to_end_duration",
        "alignment_buffered",
        "processed_data",
        "persisted_data",
    }
    size = body["summary"]["state_size"]
    assert (size["min"], size["max"], size["avg"]) == (1000, 4000, 2333)
    assert set(size) == {"min", "max", "avg", "p50", "p90", "p95", "p99", "p999"}
    assert body["summary"]["end_to_end_duration"]["max"] == 500
    latest = body["latest"]
    assert latest["completed"]["id"] == 2 and latest["completed"]["className"] == "completed"
    assert latest["completed"]["external_path"] == f"file:/chk/{job_id}/chk-2"
    assert latest["savepoint"]["id"] == 4 and latest["savepoint"]["is_savepoint"] is True
    assert latest["failed"]["failure_message"] == "checkpoint 3 declined: the query stopped"
    assert [h["id"] for h in body["history"]] == [5, 4, 3, 2, 1]
    assert [h["status"] for h in body["history"]] == ["IN_PROGRESS", "COMPLETED", "FAILED", "COMPLETED", "COMPLETED"]
    assert body["history"][-1]["discarded"] is True and body["history"][3]["batch_id"] == 20
    for h in body["history"]:
        assert {
            "className",
            "id",
            "status",
            "is_savepoint",
            "trigger_timestamp",
            "latest_ack_timestamp",
            "checkpointed_size",
            "state_size",
            "end_to_end_duration",
            "num_subtasks",
            "num_acknowledged_subtasks",
            "checkpoint_type",
            "tasks",
        } <= set(h)

    for cid in range(6, 18):  # the history is bounded like Flink's web.checkpoints.history
        add_checkpoint(catalog, job_id, cid)
    history = client.get(f"/jobs/{job_id}/checkpoints").json()["history"]
    assert [h["id"] for h in history] == list(range(17, 7, -1))


def test_the_latest_restore_is_reported(client, catalog):
    job_id, vertex_id, ex0 = running_job(client, catalog)
    with catalog.session() as s:
        repository.set_execution_restore(
            s, repository.get_execution(s, ex0), path="/sp/savepoint-abcdef-0123456789ab", checkpoint_id=None
        )
    _, ex1 = schedule(catalog, job_id, attempt=1, vertex_id=vertex_id)
    with catalog.session() as s:
        repository.set_execution_restore(
            s, repository.get_execution(s, ex1), path=f"/chk/{job_id}/chk-7", checkpoint_id=7
        )
    body = client.get(f"/jobs/{job_id}/checkpoints").json()
    assert body["counts"]["restored"] == 2
    restored = body["latest"]["restored"]
    assert set(restored) == {"id", "restore_timestamp", "is_savepoint", "external_path"}
    assert (restored["id"], restored["is_savepoint"], restored["external_path"]) == (
        7,
        False,
        f"file:/chk/{job_id}/chk-7",
    )
    assert restored["restore_timestamp"] > 0
    attempts = client.get(f"/jobs/{job_id}/vertices/{vertex_id}").json()["attempts"]
    assert [(a["restored-from"], a["restored-checkpoint-id"]) for a in attempts] == [
        ("/sp/savepoint-abcdef-0123456789ab", None),
        (f"/chk/{job_id}/chk-7", 7),
    ]


def test_checkpoint_details(client, catalog):
    job_id, vertex_id, ex_id = running_job(client, catalog)
    add_checkpoint(catalog, job_id, 2, size=2048, ex_id=ex_id, vertex_id=vertex_id)
    d = client.get(f"/jobs/{job_id}/checkpoints/details/2").json()
    assert (d["id"], d["status"], d["state_size"], d["batch_id"]) == (2, "COMPLETED", 2048, 20)
    assert list(d["tasks"]) == [vertex_id] and d["tasks"][vertex_id]["num_acknowledged_subtasks"] == 1
    assert d["source_offsets"] == [{"source": 2}] and d["execution_id"] == ex_id
    r = client.get(f"/jobs/{job_id}/checkpoints/details/3")
    assert r.status_code == 404 and r.json()["field"] == "checkpointid"
    for bad in ("x", "-1", str(2**63)):
        r = client.get(f"/jobs/{job_id}/checkpoints/details/{bad}")
        assert r.status_code == 400 and r.json()["field"] == "checkpointid", bad
    assert client.get(f"/jobs/{'0' * 32}/checkpoints/details/2").status_code == 404


def test_checkpoint_config_merges_the_job_and_the_cluster_default(client, catalog):
    job_id, _, _ = running_job(
        client,
        catalog,
        {
            "flinkConfiguration": {
                "execution.checkpointing.interval": "1 s",
                "execution.checkpointing.timeout": "2 min",
                "state.checkpoints.num-retained": "5",
                "execution.checkpointing.externalized-checkpoint-retention": "DELETE_ON_CANCELLATION",
            }
        },
    )
    cfg = client.get(f"/jobs/{job_id}/checkpoints/config").json()
    assert (cfg["mode"], cfg["interval"], cfg["timeout"], cfg["min_pause"], cfg["max_concurrent"]) == (
        "exactly_once",
        1000,
        120_000,
        0,
        1,
    )
    assert cfg["externalization"] == {"enabled": True, "delete_on_cancellation": True}
    assert (cfg["state_backend"], cfg["checkpoint_storage"], cfg["unaligned_checkpoints"]) == (
        "hashmap",
        "FileSystemCheckpointStorage",
        False,
    )
    assert cfg["options"]["state.checkpoints.num-retained"] == 5
    plain, _, _ = running_job(client, catalog)
    assert client.get(f"/jobs/{plain}/checkpoints/config").json()["interval"] == 10_000  # the cluster default
    off, _, _ = running_job(client, catalog, {"flinkConfiguration": {"execution.checkpointing.interval": "0"}})
    assert client.get(f"/jobs/{off}/checkpoints/config").json()["interval"] == 2**63 - 1


# --- /v1/ -------------------------------------------------------------------------------------------


def test_every_endpoint_is_also_served_under_v1(client, catalog, transport):
    job_id, _, _ = running_job(client, catalog)
    # `flink list` sends a `{}` body with its GET.
    r = client.request("GET", "/v1/jobs/overview", json={})
    assert r.status_code == 200 and [j["jid"] for j in r.json()["jobs"]] == [job_id]
    assert client.get("/v1/overview").json()["taskmanagers"] == 0
    assert client.get(f"/v1/jobs/{job_id}").json()["jid"] == job_id
    rid = client.post(f"/v1/jobs/{job_id}/savepoints", json={"target-directory": "/sp"}).json()["request-id"]
    assert client.get(f"/v1/jobs/{job_id}/savepoints/{rid}").json()["status"] == {"id": "IN_PROGRESS"}
    assert client.post(f"/v1/jobs/{job_id}/stop", json={}).status_code == 202
    assert client.get(f"/v1/jobs/{job_id}/checkpoints").json()["counts"]["total"] == 0
    assert client.get(f"/v1/jobs/{job_id}/checkpoints/config").status_code == 200
    assert client.patch(f"/v1/jobs/{job_id}", params={"mode": "cancel"}).status_code == 202
    assert "/v1/jobs/overview" not in client.get("/openapi.json").json()["paths"]
    # Flink's REST client reads an error only when "errors" is the one key of the body.
    r = client.post(f"/v1/jobs/{'0' * 32}/savepoints", json={})
    assert r.status_code == 404 and r.json() == {
        "errors": [f"job '{'0' * 32}' not found (hint: GET /jobs lists the known job ids)"]
    }
    r = client.post(f"/v1/jobs/{job_id}/savepoints", json={"target-directory": "s3://b/x"})
    assert r.status_code == 400 and list(r.json()) == ["errors"]
    assert client.get("/v1/no/such/thing").json() == {
        "errors": ["Not found: /v1/no/such/thing (no such resource; the API is described at /docs)"]
    }


# --- savepoint disposal -----------------------------------------------------------------------------


def test_disposal_deletes_the_snapshot_and_discards_its_record(client, catalog, tmp_path):
    job_id, _, _ = running_job(client, catalog)
    sp = snapshot(tmp_path / "roots" / "sp" / "savepoint-abcdef-0123456789ab", job_id)
    add_checkpoint(catalog, job_id, 4, kind="savepoint", path=str(sp))
    r = client.post("/savepoint-disposal", json={"savepoint-path": f"file://{sp}"})
    assert r.status_code == 200 and set(r.json()) == TRIGGER_KEYS  # Flink answers this trigger with 200
    rid = r.json()["request-id"]
    assert not sp.exists() and (tmp_path / "roots" / "sp").is_dir()
    assert client.get(f"/savepoint-disposal/{rid}").json() == {"status": {"id": "COMPLETED"}, "operation": {}}
    op = operation(catalog, rid)
    assert (op.kind, op.status, op.job_id) == ("dispose", "COMPLETED", None)
    with catalog.session() as s:
        assert repository.get_checkpoint(s, job_id, 4).status == "DISCARDED"
    stats = client.get(f"/jobs/{job_id}/checkpoints").json()
    assert stats["latest"]["savepoint"]["discarded"] is True


def test_disposal_of_what_is_not_a_snapshot_fails_and_deletes_nothing(client, catalog, tmp_path):
    keep = tmp_path / "roots" / "precious"
    keep.mkdir(parents=True)
    (keep / "data.txt").write_text("mine")
    for path in (str(keep), str(tmp_path / "roots" / "missing")):
        r = client.post("/v1/savepoint-disposal", json={"savepoint-path": path})
        assert r.status_code == 404, r.text
        assert "not a savepoint this cluster knows" in r.json()["errors"][0] and path in r.json()["errors"][0]
    assert (keep / "data.txt").read_text() == "mine"
    r = client.post("/savepoint-disposal", json={"savepoint-path": "s3://bucket/sp"})
    assert r.status_code == 400 and r.json()["field"] == "savepoint-path"
    r = client.post("/savepoint-disposal", json={})
    assert r.status_code == 400 and r.json()["field"] == "savepoint-path"
    with catalog.session() as s:
        assert not s.execute(select(Operation).where(Operation.kind == "dispose")).first()


def test_a_copied_metadata_file_does_not_make_a_directory_disposable(client, catalog, tmp_path):
    """Issue 21: a directory holding a copy of a real snapshot's _metadata was deleted, with an
    `important/` folder beside the copy. Only what the catalog records is disposed of."""
    job_id, _, _ = running_job(client, catalog)
    real = snapshot(tmp_path / "roots" / "savepoint-abcdef-0123456789ab", job_id)
    add_checkpoint(catalog, job_id, 4, kind="savepoint", path=str(real))
    decoy = tmp_path / "roots" / "projects"
    (decoy / "important").mkdir(parents=True)
    (decoy / "important" / "thesis.tex").write_text("years of work")
    (decoy / "spark").mkdir()
    (decoy / "_metadata").write_bytes((real / "_metadata").read_bytes())
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for path in (str(decoy), f"file://{decoy}/_metadata"):
        r = client.post("/savepoint-disposal", json={"savepoint-path": path})
        assert r.status_code == 404 and "not a savepoint this cluster knows" in r.json()["errors"][0], r.text
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert (decoy / "important" / "thesis.tex").read_text() == "years of work"


def test_a_symlink_to_a_real_savepoint_is_refused_and_not_renamed(client, catalog, tmp_path):
    """Issue 21: disposal through a symlink renamed the link to `.…disposing-…` and left it."""
    job_id, _, _ = running_job(client, catalog)
    real = snapshot(tmp_path / "roots" / "savepoint-abcdef-0123456789ab", job_id)
    add_checkpoint(catalog, job_id, 4, kind="savepoint", path=str(real))
    link = tmp_path / "roots" / "latest"
    link.symlink_to(real)
    linked_dir = tmp_path / "roots" / "via"
    linked_dir.symlink_to(tmp_path / "roots")
    # The catalog may even record the link's path: a symlink is refused before anything else.
    add_checkpoint(catalog, job_id, 5, kind="savepoint", path=str(link))
    for path in (str(link), str(linked_dir / real.name)):
        r = client.post("/savepoint-disposal", json={"savepoint-path": path})
        assert r.status_code == 400, r.text
        assert "symlink" in r.json()["errors"][0] and r.json()["field"] == "savepoint-path"
    assert link.is_symlink() and linked_dir.is_symlink() and (real / "_metadata").is_file()
    assert sorted(p.name for p in (tmp_path / "roots").iterdir()) == ["latest", real.name, "via"]


def test_disposal_outside_the_storage_roots_is_refused(client, catalog, tmp_path):
    job_id, _, _ = running_job(client, catalog)
    outside = snapshot(tmp_path / "elsewhere" / "savepoint-abcdef-0123456789ab", job_id)
    add_checkpoint(catalog, job_id, 4, kind="savepoint", path=str(outside))
    r = client.post("/savepoint-disposal", json={"savepoint-path": str(outside)})
    assert r.status_code == 400 and "not under an allowed storage root" in r.json()["errors"][0]
    assert "storage_roots" in r.json()["errors"][0] and (outside / "_metadata").is_file()


@pytest.mark.parametrize("route,field", [("savepoints", "target-directory"), ("stop", "targetDirectory")])
def test_savepoint_targets_outside_the_storage_roots_are_400(
    client, catalog, transport, settings, tmp_path, route, field
):
    """Issue 21: `POST /jobs/{id}/savepoints {"target-directory": "/etc/…"}` wrote there."""
    job_id, _, _ = running_job(client, catalog)
    inside = tmp_path / "roots"
    inside.mkdir()
    (inside / "escape").symlink_to("/etc")
    for target in ("/etc/headrace-x", "file:///etc", f"{settings.savepoints}/../../etc", str(inside / "escape")):
        r = client.post(f"/jobs/{job_id}/{route}", json={field: target})
        assert r.status_code == 400, (target, r.text)
        err = r.json()
        assert err["field"] == field and "outside the allowed storage roots" in err["errors"][0], err
        assert "storage_roots" in err["errors"][0] and str(settings.savepoints) in err["errors"][0]
        assert str(settings.savepoints) in err["allowed-roots"]
    assert not [b for b in transport.bodies(JM_STREAM) if isinstance(b, RequestSavepoint)]
    with catalog.session() as s:
        assert not s.execute(select(Operation).where(Operation.job_id == job_id)).first()
        assert repository.get_job(s, job_id).status == J.RUNNING.value
    assert not Path("/etc/headrace-x").exists()


def test_a_jobs_savepoint_dir_and_restore_path_outside_the_roots_are_400(client, catalog, transport, tmp_path):
    sp = snapshot(tmp_path / "elsewhere" / "savepoint-abcdef-0123456789ab")
    jar = upload(client)["id"]
    for body, field in (
        ({"savepointPath": str(sp)}, "savepointPath"),
        ({"flinkConfiguration": {"execution.savepoint.path": str(sp)}}, "execution.savepoint.path"),
        ({"flinkConfiguration": {"state.savepoints.dir": "/etc"}}, "state.savepoints.dir"),
    ):
        r = client.post(f"/jars/{jar}/run", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["field"] == field and "outside the allowed storage roots" in r.json()["errors"][0]
    assert client.get("/jobs").json() == {"jobs": []}


# --- submitting from a snapshot -----------------------------------------------------------------


def test_run_from_a_savepoint_stores_the_resolved_local_path(client, catalog, transport, tmp_path):
    sp = snapshot(tmp_path / "roots" / "savepoint-abcdef-0123456789ab")
    jar = upload(client)["id"]
    job_id = submit(
        client, jar, {"savepointPath": f"file://{sp}/", "allowNonRestoredState": True, "claimMode": "claim"}
    )
    with catalog.session() as s:
        config = repository.get_job(s, job_id).config
    assert config == {
        "execution.savepoint.path": str(sp),
        "execution.savepoint.ignore-unclaimed-state": True,
        "execution.savepoint-restore-mode": "CLAIM",
    }
    # Flink's older restoreMode, and the path as Flink prints locations (file:/...), in the query.
    job_id = submit(client, jar, {"restoreMode": "LEGACY"}, savepointPath=f"file:{sp}")
    with catalog.session() as s:
        config = repository.get_job(s, job_id).config
    assert config == {"execution.savepoint.path": str(sp), "execution.savepoint-restore-mode": "NO_CLAIM"}


def bad_run_bodies(tmp: Path) -> list[tuple[dict, str, str]]:
    return [
        ({"savepointPath": f"{tmp}/roots/nothing-here"}, "savepointPath", "no completed checkpoint or savepoint at"),
        ({"savepointPath": f"{tmp}/roots"}, "savepointPath", "no completed checkpoint or savepoint at"),
        ({"savepointPath": "s3://bucket/sp"}, "savepointPath", "scheme 's3' is not supported"),
        ({"savepointPath": "sp/relative"}, "savepointPath", "absolute path"),
        (
            {"flinkConfiguration": {"execution.savepoint.path": f"{tmp}/roots/nothing"}},
            "execution.savepoint.path",
            "no completed checkpoint or savepoint at",
        ),
        ({"claimMode": "STEAL"}, "claimMode", "NO_CLAIM or CLAIM"),
        ({"restoreMode": "STEAL"}, "restoreMode", "NO_CLAIM or CLAIM"),
        (
            {"flinkConfiguration": {"execution.checkpointing.interval": "often"}},
            "execution.checkpointing.interval",
            "'often'",
        ),
        (
            {"flinkConfiguration": {"execution.checkpointing.max-concurrent-checkpoints": 0}},
            "execution.checkpointing.max-concurrent-checkpoints",
            ">= 1",
        ),
        (
            {"config": {"execution.checkpointing.externalized-checkpoint-retention": "KEEP"}},
            "execution.checkpointing.externalized-checkpoint-retention",
            "RETAIN_ON_CANCELLATION",
        ),
        ({"flinkConfiguration": {"state.savepoints.dir": "s3://b/sp"}}, "state.savepoints.dir", "scheme 's3'"),
    ]


def test_run_refuses_bad_restore_and_checkpoint_options(client, catalog, transport, tmp_path):
    jar = upload(client)["id"]
    for body, field, fragment in bad_run_bodies(tmp_path):
        r = client.post(f"/jars/{jar}/run", json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()
        assert err["field"] == field and fragment in err["errors"][0], (body, err)
        if "no completed" in fragment:
            assert "headrace savepoint" in err["hint"]
    assert transport.bodies(JM_STREAM) == [] and client.get("/jobs").json() == {"jobs": []}
