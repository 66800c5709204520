"""Checkpoint rows, operations and options -> Flink 2.3's JSON (services.dispatcher.views.checkpoints),
and the Java form of a failure cause (services.dispatcher.views.java_throwable). Rows are namespaces."""

from __future__ import annotations

import base64
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace as Row

import pytest

from services.dispatcher.views import checkpoints as cv
from services.dispatcher.views.java_throwable import failure_cause, serialized_throwable
from shared.checkpointing import checkpoint_config

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    return T0_MS + int(seconds * 1000)


def cp_row(cid: int, status="COMPLETED", kind="checkpoint", **kw) -> Row:
    base = dict(
        job_id="j" * 32,
        checkpoint_id=cid,
        kind=kind,
        status=status,
        execution_id="e" * 32,
        vertex_id="v" * 32,
        request_id=None,
        after="continue",
        trigger_at=at(cid),
        ack_at=None,
        batch_id=cid * 10,
        state_size=None,
        duration_ms=None,
        path=None,
        failure_cause=None,
        source_offsets=[],
    )
    if status in ("COMPLETED", "DISCARDED"):
        base.update(ack_at=at(cid + 0.25), state_size=1000 * cid, duration_ms=250, path=f"/chk/{'j' * 32}/chk-{cid}")
    base.update(kw)
    return Row(**base)


def op(status="COMPLETED", **kw) -> Row:
    return Row(
        **{
            "id": "r" * 32,
            "kind": "savepoint",
            "status": status,
            "location": None,
            "checkpoint_id": None,
            "failure_cause": None,
            **kw,
        }
    )


# --- operation results ---------------------------------------------------------------------


def test_operation_in_progress_has_no_result_yet():
    assert cv.operation_result(op("IN_PROGRESS"), "savepoint") == {"status": {"id": "IN_PROGRESS"}, "operation": None}


def test_an_operation_waiting_for_its_task_says_why_and_until_when():
    wait = {
        "reason": "the task is not RUNNING yet (job RUNNING, attempt 0 INITIALIZING)",
        "since": 100.5,
        "deadline": 700.5,
    }
    out = cv.operation_result(op("IN_PROGRESS", params={"waiting": wait}), "savepoint")
    assert out == {
        "status": {"id": "IN_PROGRESS"},
        "operation": None,
        "waiting": {"reason": wait["reason"], "since": 100500, "deadline": 700500},
    }
    # Once triggered (or ended) the wait is gone: Flink's two keys only.
    assert cv.operation_result(op("IN_PROGRESS", params={"waited_s": 3}), "savepoint") == {
        "status": {"id": "IN_PROGRESS"},
        "operation": None,
    }


def test_completed_savepoint_reports_its_location_as_flink_prints_it():
    out = cv.operation_result(op(location="/sp/savepoint-aaaaaa-0123456789ab"), "savepoint")
    assert out == {"status": {"id": "COMPLETED"}, "operation": {"location": "file:/sp/savepoint-aaaaaa-0123456789ab"}}
    assert cv.location_uri("file:///sp/x") == "file:/sp/x" and cv.location_uri(None) is None


def test_failed_operations_are_completed_with_flinks_failure_cause():
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: the task is not running'
    out = cv.operation_result(op("FAILED", failure_cause=trace), "savepoint")
    assert out["status"] == {"id": "COMPLETED"}
    cause = out["operation"]["failure-cause"]
    assert set(cause) == {"class", "stack-trace", "serialized-throwable"}
    assert (cause["class"], cause["stack-trace"]) == ("RuntimeError", trace)
    # A plain message keeps Flink's checkpoint exception as its class.
    plain = cv.operation_result(
        op("FAILED", failure_cause="job x is CREATED: snapshots need a RUNNING job"), "savepoint"
    )["operation"]["failure-cause"]
    assert plain["class"] == cv.SNAPSHOT_FAILURE and plain["stack-trace"].startswith("job x is CREATED")
    # Flink's CheckpointInfo spells it failureCause; disposal and rescaling have no other result.
    ck = cv.operation_result(op("FAILED", kind="checkpoint", failure_cause="declined"), "checkpoint")
    assert set(ck["operation"]) == {"failureCause"}
    assert cv.operation_result(op(kind="checkpoint", checkpoint_id=7), "checkpoint")["operation"] == {"checkpointId": 7}
    assert cv.operation_result(op(kind="dispose"), "info") == {"status": {"id": "COMPLETED"}, "operation": {}}
    assert set(cv.operation_result(op("FAILED", kind="dispose", failure_cause="gone"), "info")["operation"]) == {
        "failure-cause"
    }


# --- statistics ------------------------------------------------------------------------------


def test_completed_checkpoint_statistics_in_flink_shape():
    out = cv.checkpoint_statistics(cp_row(3), now_ms=ms(100))
    assert out == {
        "className": "completed",
        "id": 3,
        "status": "COMPLETED",
        "is_savepoint": False,
        "savepointFormat": None,
        "trigger_timestamp": ms(3),
        "latest_ack_timestamp": ms(3.25),
        "checkpointed_size": 3000,
        "state_size": 3000,
        "end_to_end_duration": 250,
        "alignment_buffered": 0,
        "processed_data": 0,
        "persisted_data": 0,
        "num_subtasks": 1,
        "num_acknowledged_subtasks": 1,
        "checkpoint_type": "CHECKPOINT",
        "tasks": {},
        "batch_id": 30,
        "external_path": f"file:/chk/{'j' * 32}/chk-3",
        "discarded": False,
    }


def test_discarded_failed_pending_and_savepoint_statistics():
    discarded = cv.checkpoint_statistics(cp_row(1, status="DISCARDED"), now_ms=ms(100))
    assert (discarded["className"], discarded["status"], discarded["discarded"]) == ("completed", "COMPLETED", True)
    failed = cv.checkpoint_statistics(
        cp_row(2, status="FAILED", duration_ms=1500, failure_cause="declined: x"), now_ms=ms(100)
    )
    assert (failed["className"], failed["status"], failed["failure_message"]) == ("failed", "FAILED", "declined: x")
    assert failed["failure_timestamp"] == ms(3.5) and failed["latest_ack_timestamp"] == -1
    assert "external_path" not in failed
    pending = cv.checkpoint_statistics(cp_row(4, status="IN_PROGRESS"), now_ms=ms(10))
    assert (pending["className"], pending["end_to_end_duration"], pending["num_acknowledged_subtasks"]) == (
        "in_progress",
        6000,
        0,
    )
    sync = cv.checkpoint_statistics(cp_row(5, kind="savepoint", after="stop"), now_ms=ms(100))
    assert (sync["is_savepoint"], sync["savepointFormat"], sync["checkpoint_type"]) == (
        True,
        "CANONICAL",
        "SYNC_SAVEPOINT",
    )
    assert cv.checkpoint_statistics(cp_row(6, kind="savepoint"), ms(100))["checkpoint_type"] == "SAVEPOINT"


def test_details_carry_the_task_and_the_source_offsets():
    out = cv.checkpoint_statistics(cp_row(3, source_offsets=[{"topic": 5}]), now_ms=ms(100), tasks=True)
    [(vertex_id, task)] = out["tasks"].items()
    assert vertex_id == "v" * 32 and task["state_size"] == 3000 and task["num_subtasks"] == 1
    assert out["source_offsets"] == [{"topic": 5}] and out["execution_id"] == "e" * 32


def test_stats_summary_uses_flinks_percentile_estimate():
    assert cv.stats_summary([]) == {
        "min": 0,
        "max": 0,
        "avg": 0,
        "p50": 0.0,
        "p90": 0.0,
        "p95": 0.0,
        "p99": 0.0,
        "p999": 0.0,
    }
    out = cv.stats_summary([40, 10, 30, 20])
    assert (out["min"], out["max"], out["avg"]) == (10, 40, 25)
    assert out["p50"] == 25.0 and out["p90"] == 40.0  # position q*(n+1): 2.5 -> halfway; 4.5 -> the max
    assert cv.stats_summary([7])["p99"] == 7.0


def test_checkpointing_statistics_counts_latest_and_history():
    rows = [
        cp_row(5, status="IN_PROGRESS"),
        cp_row(4, kind="savepoint"),
        cp_row(3, status="FAILED"),
        cp_row(2),
        cp_row(1, status="DISCARDED"),
    ]
    restored = Row(
        restored_from="/sp/savepoint-aaaaaa-0123456789ab",
        restored_checkpoint_id=None,
        timestamps={"CREATED": ms(0), "INITIALIZING": ms(0.5)},
        start_at=at(0.4),
    )
    out = cv.checkpointing_statistics(
        counts={"IN_PROGRESS": 1, "COMPLETED": 2, "FAILED": 1, "DISCARDED": 1},
        restored_count=1,
        summary_rows=[r for r in rows if r.status in ("COMPLETED", "DISCARDED")],
        latest_completed=rows[3],
        latest_savepoint=rows[1],
        latest_failed=rows[2],
        restored=cv.restored_statistics(restored),
        history=rows,
        now_ms=ms(100),
    )
    assert out["counts"] == {"restored": 1, "total": 5, "in_progress": 1, "completed": 3, "failed": 1}
    assert set(out["summary"]) == {
        "checkpointed_size",
        "state_size",
        "end_to_end_duration",
        "alignment_buffered",
        "processed_data",
        "persisted_data",
    }
    assert (out["summary"]["state_size"]["min"], out["summary"]["state_size"]["max"]) == (1000, 4000)
    assert out["summary"]["end_to_end_duration"]["avg"] == 250
    assert out["latest"]["completed"]["id"] == 2 and out["latest"]["savepoint"]["id"] == 4
    assert out["latest"]["failed"]["id"] == 3
    assert out["latest"]["restored"] == {
        "id": -1,
        "restore_timestamp": ms(0.5),
        "is_savepoint": True,
        "external_path": "file:/sp/savepoint-aaaaaa-0123456789ab",
    }
    assert [h["id"] for h in out["history"]] == [5, 4, 3, 2, 1]
    assert cv.restored_statistics(None) is None
    assert cv.restored_statistics(Row(restored_from=None)) is None


# --- configuration ---------------------------------------------------------------------------


def test_checkpoint_config_info_in_flink_shape():
    cfg = checkpoint_config(
        {
            "execution.checkpointing.interval": "2 s",
            "execution.checkpointing.min-pause": "500 ms",
            "execution.checkpointing.tolerable-failed-checkpoints": 3,
            "execution.checkpointing.externalized-checkpoint-retention": "DELETE_ON_CANCELLATION",
        }
    )
    out = cv.checkpoint_config_info(cfg, {})
    assert {k: v for k, v in out.items() if k != "options"} == {
        "mode": "exactly_once",
        "interval": 2000,
        "timeout": 600_000,
        "min_pause": 500,
        "max_concurrent": 1,
        "externalization": {"enabled": True, "delete_on_cancellation": True},
        "state_backend": "hashmap",
        "checkpoint_storage": "FileSystemCheckpointStorage",
        "unaligned_checkpoints": False,
        "tolerable_failed_checkpoints": 3,
        "aligned_checkpoint_timeout": 0,
        "checkpoints_after_tasks_finish": True,
        "state_changelog_enabled": False,
        "changelog_periodic_materialization_interval": 0,
        "changelog_storage": "memory",
    }
    assert out["options"]["state.checkpoints.num-retained"] == 3
    # Written as Flink writes them, so each reads back the same in a job's configuration.
    assert (
        out["options"]["execution.checkpointing.interval"],
        out["options"]["execution.checkpointing.timeout"],
        out["options"]["execution.checkpointing.min-pause"],
    ) == ("2 s", "10 min", "500 ms")
    assert checkpoint_config(out["options"]).as_flink() == out["options"]
    off = cv.checkpoint_config_info(checkpoint_config({"execution.checkpointing.interval": "0"}), {})
    assert off["interval"] == 0x7FFFFFFFFFFFFFFF  # Flink's Long.MAX_VALUE: no periodic checkpoints
    rocks_db = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    rocks = {"spark.sql.streaming.stateStore.providerClass": rocks_db}
    assert cv.checkpoint_config_info(checkpoint_config({}), rocks)["state_backend"] == "rocksdb"


# --- the Java form of a failure --------------------------------------------------------------


def test_failure_cause_holds_a_java_serialization_stream():
    cause = failure_cause("org.apache.flink.runtime.checkpoint.CheckpointException", "declined", "trace\nline 2")
    raw = base64.b64decode(cause["serialized-throwable"])
    assert raw[:4] == b"\xac\xed\x00\x05" and raw[4] == 0x73  # stream magic, version 5, TC_OBJECT
    assert b"org.apache.flink.util.SerializedThrowable" in raw and b"trace\nline 2" in raw
    # Java's modified UTF-8: NUL is two bytes, a supplementary character two 3-byte surrogates.
    assert b"\xc0\x80" in serialized_throwable("X", "a\x00b", "t")
    assert b"\xed\xa0\xbd\xed\xb8\x80" in serialized_throwable("X", "\U0001f600", "t")


STUB = """
package org.apache.flink.util;
public class SerializedThrowable extends Exception {
    private static final long serialVersionUID = 7284183123441947635L;
    private final byte[] serializedException = null;
    private final String originalErrorClassName = null;
    private final String fullStringifiedStackTrace = null;
    public String toString() { return originalErrorClassName + ": " + getMessage(); }
    public String trace() { return fullStringifiedStackTrace; }
}
"""
READER = """
import java.io.*;
public class Read {
    public static void main(String[] a) throws Exception {
        byte[] b = java.util.Base64.getDecoder().decode(a[0]);
        org.apache.flink.util.SerializedThrowable t = (org.apache.flink.util.SerializedThrowable)
            new ObjectInputStream(new ByteArrayInputStream(b)).readObject();
        System.out.print(t + "|" + t.trace() + "|" + t.getCause());
    }
}
"""


@pytest.mark.skipif(not shutil.which("javac"), reason="needs a JDK (javac)")
def test_java_reads_it_back_as_flinks_serialized_throwable(tmp_path):
    """Java deserializes the stream into a class with Flink's name, serialVersionUID and fields
    (checked by hand against flink-dist 2.3.0 as well)."""
    (tmp_path / "org/apache/flink/util").mkdir(parents=True)
    (tmp_path / "org/apache/flink/util/SerializedThrowable.java").write_text(STUB)
    (tmp_path / "Read.java").write_text(READER)
    subprocess.run(
        [
            "javac",
            "-d",
            str(tmp_path),
            str(tmp_path / "org/apache/flink/util/SerializedThrowable.java"),
            str(tmp_path / "Read.java"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    long_trace = "Traceback\n" + "x" * 70_000 + "\nValueError: ünï\U0001f600"
    cause = failure_cause("ValueError", "ünï\U0001f600", long_trace)
    out = subprocess.run(
        ["java", "-cp", str(tmp_path), "Read", cause["serialized-throwable"]],
        check=True,
        capture_output=True,
        timeout=120,
    ).stdout.decode("utf-8")
    assert out == f"ValueError: ünï\U0001f600|{long_trace}|null"
