"""A Delta sink's figures on their way out: Progress.sink_commit, the TaskManager's Prometheus
series, the dashboard's progress figures, and each snapshot's table version as the Checkpoints
tab reads it from the snapshot's _metadata."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest

from services.dispatcher.routes.job_metrics import task_figures
from services.dispatcher.views import snapshot_sinks
from services.taskmanager.metrics import TaskMetrics
from shared import checkpoint_storage as storage
from shared.task_protocol import Progress, decode_event, encode_line

SPEC = SimpleNamespace(job_id="job1", vertex_id="v1", execution_id="ex1", attempt=0)


def test_progress_carries_the_sinks_commit_and_prometheus_exports_it():
    event = decode_event(encode_line(Progress(batch_id=4, sink_commit={"version": 12, "files_added": 2})))
    assert event.sink_commit == {"version": 12, "files_added": 2}
    m = TaskMetrics(None)
    m.progress("tm-1", SPEC, event)
    m.progress("tm-1", SPEC, Progress(batch_id=5, sink_commit={"version": 13, "files_added": 3}))
    text = generate_latest(m.registry).decode()
    assert 'headrace_task_sink_table_version{execution="ex1",job="job1",taskmanager="tm-1"} 13.0' in text
    assert 'headrace_task_sink_files_added_total{execution="ex1",job="job1",taskmanager="tm-1"} 5.0' in text
    m.forget("tm-1", SPEC)
    assert "headrace_task_sink_table_version{" not in generate_latest(m.registry).decode()


def test_the_dashboards_figures_name_the_sinks_version():
    ex = SimpleNamespace(vertex_id="v1", id="ex1", attempt=0, taskmanager_id="tm-1")
    assert task_figures(ex, {b"batch_id": b"4", b"sink_version": b"12"})["sinkVersion"] == 12
    assert task_figures(ex, {b"batch_id": b"4"})["sinkVersion"] is None


def test_a_snapshots_table_version_is_read_from_its_metadata(tmp_path):
    entry = {
        "kind": "delta",
        "path": "/lake/t",
        "app_id": "a",
        "version": 7,
        "batch_id": 3,
        "undone": {"to_version": 5, "batches": [4, 5], "versions": [6], "rows": 10},
    }
    storage.take_empty_snapshot(tmp_path / "chk-1", metadata={"job_id": "j", "sink": entry})
    storage.take_empty_snapshot(tmp_path / "chk-2", metadata={"job_id": "j"})
    fields = snapshot_sinks.sink_fields(f"file:{tmp_path / 'chk-1'}")
    assert fields["sink_table"] == "/lake/t" and fields["sink_version"] == 7
    assert "batches 4..5 undone" in fields["sink_undone"]
    assert snapshot_sinks.sink_fields(str(tmp_path / "chk-2")) == {}
    assert snapshot_sinks.sink_fields(str(tmp_path / "gone")) == {}
    assert snapshot_sinks.sink_fields(None) == {}
