"""The Delta Lake sink and source on real tables in a plain Spark session, each outcome read back by
an independent reader (the `deltalake` package, delta-rs, no Spark) as well as by Spark.

The scenario of the fencing tests (as tests/integration/test_sink_fencing.py for the other sinks):
attempt A commits batches 0..5; attempt B restores the snapshot at batch 2 and commits 3..6 with
other contents; the table must hold "0..2 of A, then 3..6 of B". Then A writes again (a zombie):
refused, nothing changes. Most tests call the sink's foreachBatch function with explicit batch
ids, as Spark does; one runs a real streaming query through the handle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable

from services.taskmanager.runtime.connectors import SinkFencedError, SinkOwnedError, SinkOwner, delta_log
from services.taskmanager.runtime.connectors.delta_errors import DeltaSchemaMismatch, DeltaUndoRefused
from services.taskmanager.runtime.connectors.delta_log_checkpoint import NO_INLINE_CHECKPOINT
from services.taskmanager.runtime.connectors.delta_maintenance import Policy
from services.taskmanager.runtime.connectors.delta_sink import delta_sink
from services.taskmanager.runtime.connectors.delta_source import delta_stream, delta_table
from services.taskmanager.runtime.spark_session import build_spark

KV = "k string, v long, src string"
EVENTS = [
    ("a", 1),
    ("b", 2),
    ("a", 3),
    ("c", 4),
    ("b", 5),
    ("d", 6),
    ("a", 7),
    ("e", 8),
    ("c", 9),
    ("f", 10),
    ("b", 11),
    ("g", 12),
    ("h", 13),
    ("a", 14),
]
LINEAGE_A = {b: (2 * b, 2 * b + 2) for b in range(6)}
LINEAGE_B = {3: (6, 7), 4: (7, 10), 5: (10, 12), 6: (12, 14)}
OWNER = SinkOwner(lineage="lin-a", job_id="job-a")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_spark(1, tmp_path_factory.mktemp("spark"), shuffle_partitions=1)
    yield session
    session.stop()


def rows(attempt: str, batch: int, lo: int, hi: int) -> list[tuple[str, int, str]]:
    return [(k, v, f"{attempt}{batch}") for k, v in EVENTS[lo:hi]]


def expected_appends() -> list[tuple[str, int, str]]:
    out = [r for b in range(3) for r in rows("A", b, *LINEAGE_A[b])]
    return sorted(out + [r for b in range(3, 7) for r in rows("B", b, *LINEAGE_B[b])])


def read_rs(path: Path) -> list[tuple]:
    """The table as delta-rs reads it (no Spark)."""
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(tuple(r[c] for c in ("k", "v", "src")) for r in table.to_pylist())


def read_spark(spark, path: Path) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).select("k", "v", "src").collect())


def make(spark, path: Path, *, lineage: str = "lin-a", **kw):
    schema = spark.createDataFrame([], KV)
    return delta_sink(schema, str(path), lineage=lineage, **kw)


def sink_of(handle):
    """The DeltaSink behind a handle (its foreachBatch and snapshot hooks)."""
    return handle.on_snapshot.__self__


def two_attempts(spark, path: Path, **kw):
    """A commits 0..5 (snapshot at batch 2 taken meanwhile); B restores it and commits 3..6."""
    a = make(spark, path, **kw)
    a.prepare(10, -1, OWNER)
    entry = None
    for b, (lo, hi) in LINEAGE_A.items():
        assert sink_of(a).write_batch(spark.createDataFrame(rows("A", b, lo, hi), KV), b) is True
        if b == 2:
            entry = a.on_snapshot(2, "checkpoint", str(path.parent / "chk-1"))
    b_handle = make(spark, path, **kw)
    b_handle.restored_sink = entry
    b_handle.prepare(20, 2, SinkOwner(lineage="lin-a", job_id="job-a"))
    for b, (lo, hi) in LINEAGE_B.items():
        assert sink_of(b_handle).write_batch(spark.createDataFrame(rows("B", b, lo, hi), KV), b) is True
    return a, b_handle, entry


def test_append_restore_undoes_the_discarded_batches_and_fences_the_zombie(spark, tmp_path):
    path = tmp_path / "t"
    a, b, entry = two_attempts(spark, path)
    assert read_rs(path) == expected_appends() == read_spark(spark, path)
    undone = sink_of(b).undone
    assert undone is not None and undone.batches == (3, 4, 5) and undone.to_version == entry["version"]
    history = DeltaTable(str(path)).history()
    assert any(h["operation"] == "RESTORE" and "batches 3..5" in (h.get("userMetadata") or "") for h in history)
    # Batch 6 again in B (Spark re-running it): Delta skips it.
    assert sink_of(b).write_batch(spark.createDataFrame(rows("B", 6, 12, 14), KV), 6) is False
    # The zombie A writes batch 7, above anything B wrote: refused, nothing written.
    version = DeltaTable(str(path)).version()
    with pytest.raises(SinkFencedError):
        sink_of(a).write_batch(spark.createDataFrame([("z", 99, "A7")], KV), 7)
    assert DeltaTable(str(path)).version() == version
    assert read_rs(path) == expected_appends()
    # The snapshot entry names the table, its version and what the restore undid.
    snap = b.on_snapshot(6, "savepoint", str(tmp_path / "sp"))
    assert snap["path"] == str(path) and snap["version"] == version and snap["undone"]["batches"] == [3, 4, 5]
    assert sink_of(b).figures(6) is None or sink_of(b).figures(6)["version"] <= version


def test_a_zombie_that_wrote_between_the_claim_and_its_fence_is_undone(spark, tmp_path):
    """The older attempt's batch lands after the newer attempt's restore point: the undo takes it."""
    path = tmp_path / "t"
    a = make(spark, path)
    a.prepare(10, -1, OWNER)
    sink_of(a).write_batch(spark.createDataFrame(rows("A", 0, 0, 2), KV), 0)
    entry = a.on_snapshot(0, "checkpoint", str(tmp_path / "chk"))
    sink_of(a).write_batch(spark.createDataFrame(rows("A", 1, 2, 4), KV), 1)
    b = make(spark, path)
    b.restored_sink = entry
    b.prepare(20, 0, OWNER)
    assert read_rs(path) == sorted(rows("A", 0, 0, 2))


def test_another_lineage_is_refused_unless_both_share_by_append(spark, tmp_path):
    path = tmp_path / "t"
    a = make(spark, path)
    a.prepare(10, -1, OWNER)
    sink_of(a).write_batch(spark.createDataFrame(rows("A", 0, 0, 2), KV), 0)
    other = make(spark, path, lineage="lin-b")
    with pytest.raises(SinkOwnedError) as err:
        other.prepare(30, -1, SinkOwner(lineage="lin-b", job_id="job-b"))
    assert "lin-a" in str(err.value) and "job-a" in str(err.value) and "UNSET TBLPROPERTIES" in str(err.value)
    assert read_rs(path) == sorted(rows("A", 0, 0, 2))

    shared = tmp_path / "shared"
    s1 = make(spark, shared, shared_append=True)
    s1.prepare(10, -1, OWNER)
    s2 = make(spark, shared, lineage="lin-b", shared_append=True)
    s2.prepare(30, -1, SinkOwner(lineage="lin-b", job_id="job-b"))
    sink_of(s1).write_batch(spark.createDataFrame(rows("A", 0, 0, 2), KV), 0)
    sink_of(s2).write_batch(spark.createDataFrame(rows("B", 0, 2, 4), KV), 0)
    assert read_rs(shared) == sorted(rows("A", 0, 0, 2) + rows("B", 0, 2, 4))
    # A restore of lineage A that would undo its batch after B appended: refused, nothing changed.
    entry = {"kind": "delta", "path": str(shared), "app_id": sink_of(s1).app, "version": 1}
    s1_again = make(spark, shared, shared_append=True)
    s1_again.restored_sink = entry
    with pytest.raises(DeltaUndoRefused) as undo:
        s1_again.prepare(40, -1, OWNER)
    assert "another writer committed after it" in str(undo.value)
    assert read_rs(shared) == sorted(rows("A", 0, 0, 2) + rows("B", 0, 2, 4))


def test_update_mode_merges_by_key_and_a_restore_rewinds_the_merges(spark, tmp_path):
    path = tmp_path / "t"
    schema = spark.createDataFrame([], "k string, n long")

    def totals(upto: int, touched: range) -> list[tuple[str, int]]:
        counts: dict[str, int] = {}
        for k, _ in EVENTS[:upto]:
            counts[k] = counts.get(k, 0) + 1
        return sorted({(k, counts[k]) for k, _ in EVENTS[touched.start : touched.stop]})

    a = delta_sink(schema, str(path), lineage="lin-a", output_mode="update", key_columns=["k"])
    a.prepare(10, -1, OWNER)
    entry = None
    for b, (lo, hi) in LINEAGE_A.items():
        sink_of(a).write_batch(spark.createDataFrame(totals(hi, range(lo, hi)), "k string, n long"), b)
        if b == 2:
            entry = a.on_snapshot(2, "checkpoint", str(tmp_path / "chk"))
    b_handle = delta_sink(schema, str(path), lineage="lin-a", output_mode="update", key_columns=["k"])
    b_handle.restored_sink = entry
    b_handle.prepare(20, 2, OWNER)
    got = sorted((r["k"], r["n"]) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())
    assert got == totals(6, range(0, 6))  # as after batch 2
    for b, (lo, hi) in LINEAGE_B.items():
        sink_of(b_handle).write_batch(spark.createDataFrame(totals(hi, range(lo, hi)), "k string, n long"), b)
    assert (
        sink_of(b_handle).write_batch(spark.createDataFrame(totals(14, range(12, 14)), "k string, n long"), 6) is False
    )
    got = sorted((r["k"], r["n"]) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())
    assert got == totals(14, range(0, 14))


def test_complete_mode_replaces_the_rows_in_one_commit(spark, tmp_path):
    path = tmp_path / "t"
    h = make(spark, path, output_mode="complete")
    h.prepare(10, -1, OWNER)
    sink_of(h).write_batch(spark.createDataFrame(rows("A", 0, 0, 4), KV), 0)
    sink_of(h).write_batch(spark.createDataFrame(rows("A", 1, 4, 6), KV), 1)
    assert read_rs(path) == sorted(rows("A", 1, 4, 6))


def test_a_schema_that_does_not_fit_names_the_columns_and_merge_schema_adds_them(spark, tmp_path):
    path = tmp_path / "t"
    h = make(spark, path)
    h.prepare(10, -1, OWNER)
    sink_of(h).write_batch(spark.createDataFrame(rows("A", 0, 0, 2), KV), 0)
    wider = spark.createDataFrame([], KV + ", extra double")
    h2 = delta_sink(wider, str(path), lineage="lin-a")
    with pytest.raises(DeltaSchemaMismatch) as err:
        h2.prepare(20, 0, OWNER)
    assert err.value.columns == ("extra",) and "mergeSchema" in str(err.value)
    retyped = delta_sink(spark.createDataFrame([], "k string, v string, src string"), str(path), lineage="lin-a")
    with pytest.raises(DeltaSchemaMismatch, match=r"v \(table: bigint, rows: string\)"):
        retyped.prepare(20, 0, OWNER)
    h3 = delta_sink(wider, str(path), lineage="lin-a", options={"mergeSchema": "true"})
    h3.restored_sink = h.on_snapshot(0, "checkpoint", str(tmp_path / "c"))
    h3.prepare(30, 0, OWNER)
    sink_of(h3).write_batch(spark.createDataFrame([("x", 1, "A1", 2.5)], KV + ", extra double"), 1)
    assert "extra" in DeltaTable(str(path)).schema().to_arrow().names


def test_a_vacuumed_restore_point_refuses_the_restore(spark, tmp_path):
    path = tmp_path / "t"
    h = make(spark, path)
    h.prepare(10, -1, OWNER)
    for b in range(3):
        sink_of(h).write_batch(spark.createDataFrame(rows("A", b, 2 * b, 2 * b + 2), KV), b)
    entry = h.on_snapshot(0, "checkpoint", str(tmp_path / "gone"))
    spark.sql(f"OPTIMIZE {delta_log.quoted(str(path))}").collect()
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM {delta_log.quoted(str(path))} RETAIN 0 HOURS").collect()
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    before = read_rs(path)
    again = make(spark, path)
    again.restored_sink = entry
    with pytest.raises(DeltaUndoRefused, match="VACUUM deleted its files"):
        again.prepare(20, 0, OWNER)
    assert read_rs(path) == before


def test_compaction_every_n_batches_keeps_few_files_and_pins_hold_vacuum(spark, tmp_path):
    path = tmp_path / "t"
    h = make(spark, path, policy=Policy(optimize_every=4, vacuum_every=8, vacuum_retention_s=0.0))
    h.prepare(10, -1, OWNER)
    snapshot = tmp_path / "sp"
    for b in range(8):
        sink_of(h).write_batch(spark.createDataFrame(rows("A", b % 6, 0, 2), KV), b)
        if b == 1:
            h.on_snapshot(1, "savepoint", str(snapshot))
            snapshot.mkdir()
            (snapshot / "_metadata").write_text("{}")
    assert len(DeltaTable(str(path)).file_uris()) <= 2
    # The savepoint's version (batch 1) was pinned: VACUUM kept its files, so a restore works.
    assert sink_of(h).maintenance.retention_s() > 0
    pins = json.loads(next((path / "_headrace").glob("pins-*.json")).read_text())
    assert any(p["snapshot"] == str(snapshot) for p in pins)
    ops = [x["operation"] for x in DeltaTable(str(path)).history()]
    assert "OPTIMIZE" in ops and "VACUUM END" in ops


def test_a_streaming_query_through_the_handle_and_the_delta_source(spark, tmp_path):
    path = tmp_path / "bronze"
    from services.taskmanager.runtime.connectors import register_data_sources

    register_data_sources(spark)
    src = (
        spark.readStream.format("datagen")
        .options(total="300", max_rows_per_batch="100", partitions="1")
        .load()
        .selectExpr("url as k", "i as v", "'gen' as src")
    )
    h = delta_sink(src, str(path), lineage="lin-s")
    h.prepare(1, -1, SinkOwner(lineage="lin-s", job_id="job-s"))
    q = h.start(str(tmp_path / "chk"))
    try:
        q.processAllAvailable()
        q.processAllAvailable()
    finally:
        q.stop()
    got = read_rs(path)
    assert sorted(r[1] for r in got) == list(range(300))  # every row once
    assert len(delta_table(spark, str(path)).collect()) == len(got)
    seen: list[int] = []
    q2 = (
        delta_stream(spark, str(path))
        .writeStream.foreachBatch(lambda d, _b: seen.append(d.count()))
        .option("checkpointLocation", str(tmp_path / "chk2"))
        .start()
    )
    try:
        q2.processAllAvailable()
    finally:
        q2.stop()
    assert sum(seen) == len(got)
    shutil.rmtree(tmp_path / "chk2", ignore_errors=True)


def test_the_sink_checkpoints_the_log_after_its_commits_and_readers_start_from_it(spark, tmp_path):
    path = tmp_path / "t"
    h = make(spark, path)
    h.prepare(10, -1, OWNER)
    sink = sink_of(h)
    for b in range(14):
        sink.write_batch(spark.createDataFrame(rows("A", b % 6, 0, 2), KV), b)
    log = path / "_delta_log"
    created = [json.loads(line) for line in (log / f"{0:020d}.json").read_text().splitlines()]
    config = next(a["metaData"] for a in created if "metaData" in a)["configuration"]
    assert config["delta.checkpointInterval"] == str(NO_INLINE_CHECKPOINT)  # set by the creating commit
    on_disk = {int(f.name[:20]) for f in log.glob("*.checkpoint.parquet")}
    # every checkpoint is one the sink wrote with delta-rs: no commit wrote one inside it
    assert on_disk == {v for v, _s, by in sink.log_checkpoints.written if by == "delta-rs"}
    assert max(on_disk) >= 10
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == max(on_disk)
    # A reader holding only the checkpoint and the commits after it sees every row.
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    for f in (copy / "_delta_log").iterdir():
        if f.name[:20].isdigit() and f.suffix in (".json", ".crc") and int(f.name[:20]) <= max(on_disk):
            f.unlink()
    expected = sorted(r for b in range(14) for r in rows("A", b % 6, 0, 2))
    assert read_rs(copy) == read_rs(path) == expected
    assert read_spark(spark, copy) == expected
    # Delta finds the sink's transaction version (its idempotence) in delta-rs's checkpoint alone.
    newest = max(on_disk)
    alone = tmp_path / "checkpoint-alone"
    shutil.copytree(path, alone)
    for f in (alone / "_delta_log").iterdir():
        if f.name[:20].isdigit() and (f.suffix == ".crc" or (f.suffix == ".json" and int(f.name[:20]) != newest)):
            f.unlink()  # Delta wants the commit of the checkpoint's version itself, not its contents
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    snap = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(alone)).update(False, none, none)
    txn = next(c.txns[sink.app] for v in range(newest, 0, -1) if sink.app in (c := delta_log.commit(str(path), v)).txns)
    assert int(snap.version()) == newest
    assert int(snap.transactions().get(sink.app).get()) == txn


def test_delta_keeps_its_own_checkpoints_when_asked_and_on_a_table_the_sink_did_not_create(spark, tmp_path):
    for name, kw in (("asked", {"policy": Policy(log_checkpoint_every=0)}), ("theirs", {})):
        path = tmp_path / name
        if name == "theirs":
            spark.createDataFrame([], KV).write.format("delta").save(str(path))
        h = make(spark, path, **kw)
        h.prepare(10, -1, OWNER)
        for b in range(10):
            sink_of(h).write_batch(spark.createDataFrame(rows("A", b % 6, 0, 2), KV), b)
        assert not sink_of(h).log_checkpoints.written
        assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()  # Delta's, inside commit 10
        assert len(read_rs(path)) == 20
