"""Checkpoint storage on fabricated Spark checkpoint trees (file logic only, no Spark)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from shared import checkpoint_storage as storage
from shared.checkpoint_storage import SnapshotError, copying

KEY_SCHEMA = {"type": "struct", "fields": [{"name": "url", "type": "string", "nullable": True, "metadata": {}}]}
VALUE_SCHEMA = {"type": "struct", "fields": [{"name": "count", "type": "long", "nullable": True, "metadata": {}}]}
CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    ),
}


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    # Spark's local filesystem writes a checksum beside every file
    (path.parent / f".{path.name}.crc").write_bytes(b"crc!")
    return path


def offsets_text(batch: int) -> str:
    meta = {"batchWatermarkMs": 1000 * batch, "batchTimestampMs": 5, "conf": CONF}
    return f"v1\n{json.dumps(meta)}\n{json.dumps({'i': 100 * (batch + 1)})}\n-"


def schema_bytes() -> bytes:
    """The framing Spark 4.3 uses: "v2", then length-prefixed JSON (key, then value schema)."""
    out = struct.pack(">H", 2) + b"v2"
    for schema in (KEY_SCHEMA, VALUE_SCHEMA):
        data = json.dumps(schema).encode()
        out += struct.pack(">IH", 1, len(data)) + data
    return out


def fake_live(
    root: Path,
    *,
    committed: int,
    planned: int,
    state_versions: int | None = None,
    snapshots: tuple[int, ...] = (),
    first_delta: int = 1,
    rocksdb: bool = False,
    partitions: int = 2,
    operators: tuple[int, ...] = (0,),
) -> Path:
    """A Spark checkpoint dir: batches 0..committed committed, 0..planned planned, state files
    up to version `state_versions` (default planned + 1: the in-flight batch's state is there)."""
    write(root / "metadata", '{"id":"4f1c0c4e-7d57-4a8e-9f3e-0d5b7a2b1c3d"}')
    for b in range(planned + 1):
        write(root / "offsets" / str(b), offsets_text(b))
        write(root / "sources" / "0" / str(b), f"v1\n{b}")
    write(root / "sources" / "0" / "9.compact", "v1\ncompacted")
    for b in range(committed + 1):
        write(root / "commits" / str(b), 'v1\n{"nextBatchWatermarkMs":0}')
    top = planned + 1 if state_versions is None else state_versions
    for op in operators:
        op_dir = root / "state" / str(op)
        write(
            op_dir / "_metadata" / "metadata",
            "v1\n"
            + json.dumps(
                {
                    "operatorInfo": {"operatorId": op, "operatorName": "stateStoreSave"},
                    "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0, "numPartitions": partitions}],
                }
            ),
        )
        for p in range(partitions):
            part = op_dir / str(p)
            write(part / "_metadata" / "schema", schema_bytes())
            for v in range(first_delta, top + 1):
                write(part / f"{v}.{'changelog' if rocksdb else 'delta'}", f"delta {op}/{p}/{v}")
            for v in snapshots:
                write(part / f"{v}.{'zip' if rocksdb else 'snapshot'}", f"full {op}/{p}/{v}")
            if rocksdb:
                write(part / "SSTs" / "000008-aaaa.sst", "sst")
            # an in-flight temporary file of Spark's atomic writes
            write(part / f".{top + 1}.delta.5a4b.tmp", "partial")
    return root


def names(root: Path, sub: str) -> list[str]:
    d = root / sub
    return sorted((p.name for p in d.iterdir() if p.is_file()), key=lambda n: (len(n), n))


@pytest.fixture
def live(tmp_path) -> Path:
    return fake_live(tmp_path / "live", committed=4, planned=5)


# ---------------------------------------------------------------- batch logs


def test_latest_batches_ignore_hidden_and_temporary_files(tmp_path):
    assert storage.latest_committed_batch(tmp_path / "nothing") is None
    assert storage.latest_planned_batch(tmp_path / "nothing") is None
    root = fake_live(tmp_path / "cp", committed=3, planned=4)
    write(root / "commits" / ".7.tmp", "x")
    assert storage.latest_committed_batch(root) == 3
    assert storage.latest_planned_batch(root) == 4


def test_spark_conf_at_reads_the_pinned_conf(live):
    assert storage.spark_conf_at(live, 2) == CONF
    with pytest.raises(SnapshotError, match=r"offsets/9: the offset log of batch 9 does not exist"):
        storage.spark_conf_at(live, 9)
    write(live / "offsets" / "8", "garbage")
    with pytest.raises(SnapshotError, match="not a Spark offset log"):
        storage.spark_conf_at(live, 8)


# ---------------------------------------------------------------- what a snapshot holds


def test_snapshot_keeps_batches_up_to_b_and_state_up_to_b_plus_1(live, tmp_path):
    info = storage.take_snapshot(live, tmp_path / "chk-1", batch_id=3, metadata={})
    spark = Path(info.path) / storage.SPARK_DIR
    assert names(spark, "offsets") == ["0", "1", "2", "3"]
    assert names(spark, "commits") == ["0", "1", "2", "3"]
    assert names(spark, "sources/0") == ["0", "1", "2", "3"]  # 9.compact belongs to batch 9
    for p in ("0", "1"):
        assert names(spark, f"state/0/{p}") == ["1.delta", "2.delta", "3.delta", "4.delta"]
        assert (spark / "state" / "0" / p / "_metadata" / "schema").read_bytes() == schema_bytes()
    assert (spark / "state" / "0" / "_metadata" / "metadata").is_file()
    assert (spark / "metadata").is_file()
    assert not [p for p in spark.rglob(".*")], "hidden files (.crc, temporaries) are not part of a snapshot"
    assert info.files == len([p for p in spark.rglob("*") if p.is_file()])
    assert info.state_size == storage.dir_size(spark)


def test_snapshot_of_the_newest_committed_batch_leaves_out_the_batch_in_flight(tmp_path):
    live = fake_live(tmp_path / "live", committed=4, planned=5, state_versions=7)
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=4, metadata={})
    spark = Path(info.path) / storage.SPARK_DIR
    assert names(spark, "offsets")[-1] == "4"
    assert names(spark, "state/0/1")[-1] == "5.delta"
    assert names(spark, "sources/0")[-1] == "4"


def test_source_compaction_files_up_to_the_batch_are_kept(tmp_path):
    live = fake_live(tmp_path / "live", committed=12, planned=12)
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=10, metadata={})
    assert "9.compact" in names(Path(info.path) / "spark", "sources/0")


def test_state_files_are_linked_and_logs_copied(live, tmp_path):
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    spark = Path(info.path) / storage.SPARK_DIR
    same = lambda rel: os.stat(live / rel).st_ino == os.stat(spark / rel).st_ino  # noqa: E731
    assert same("state/0/1/3.delta")
    assert not same("offsets/3") and not same("commits/3") and not same("sources/0/3") and not same("metadata")
    assert not same("state/0/0/_metadata/schema") and not same("state/0/_metadata/metadata")


def test_filesystems_without_hard_links_get_copies(live, tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    copied = Path(info.path) / "spark" / "state" / "0" / "0" / "4.delta"
    assert copied.read_text() == "delta 0/0/4"
    assert os.stat(copied).st_ino != os.stat(live / "state" / "0" / "0" / "4.delta").st_ino


def test_rocksdb_versions_and_shared_ssts(tmp_path):
    live = fake_live(tmp_path / "live", committed=11, planned=12, rocksdb=True, snapshots=(5, 10, 13))
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=11, metadata={})
    part = Path(info.path) / "spark" / "state" / "0" / "0"
    assert set(names(part.parent.parent.parent, "state/0/0")) == (
        {f"{v}.changelog" for v in range(1, 13)} | {"5.zip", "10.zip"}
    )
    assert names(part, "SSTs") == ["000008-aaaa.sst"]
    assert (
        os.stat(part / "SSTs" / "000008-aaaa.sst").st_ino
        == os.stat(live / "state" / "0" / "0" / "SSTs" / "000008-aaaa.sst").st_ino
    )


def test_checkpoint_format_v2_unique_ids_are_versioned_too(tmp_path):
    live = fake_live(tmp_path / "live", committed=2, planned=3, snapshots=())
    part = live / "state" / "0" / "0"
    for v in (3, 4, 5):
        write(part / f"{v}_0f8fad5b-d9cb-469f-a165-70867728950e.zip", "zip")
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=2, metadata={})
    kept = names(Path(info.path) / "spark", "state/0/0")
    assert "3_0f8fad5b-d9cb-469f-a165-70867728950e.zip" in kept
    assert not [n for n in kept if n.startswith(("4_", "5_"))]


# ---------------------------------------------------------------- refusals


def test_uncommitted_batch_is_refused(live, tmp_path):
    with pytest.raises(SnapshotError, match=r"batch 5 is not committed .*newest committed batch: 4"):
        storage.take_snapshot(live, tmp_path / "chk", batch_id=5, metadata={})
    assert list(tmp_path.glob("*chk*")) == []


def test_existing_target_is_refused(live, tmp_path):
    (tmp_path / "chk").mkdir()
    (tmp_path / "chk" / "_metadata").write_text("{}")
    with pytest.raises(SnapshotError, match="already exists"):
        storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SnapshotError, match="already exists"):
        storage.take_snapshot(live, tmp_path / "link", batch_id=3, metadata={})


def test_an_empty_directory_made_for_the_snapshot_is_written_in_place(live, tmp_path):
    """A TaskManager makes the target for its driver, which may not write the directory above
    it (services/taskmanager/tasks/storage.py): the snapshot goes into it, `_metadata` last."""
    target = tmp_path / "sp" / "savepoint-1"
    target.mkdir(parents=True)
    info = storage.take_snapshot(live, target, batch_id=3, metadata={"kind": "savepoint"})
    assert info.path == str(target) and info.batch_id == 3
    assert sorted(p.name for p in (tmp_path / "sp").iterdir()) == ["savepoint-1"], "nothing made beside it"
    assert sorted(p.name for p in target.iterdir()) == ["_metadata", "spark"]
    assert storage.read_metadata(target)["spark"]["batch_id"] == 3
    made = tmp_path / "sp" / "savepoint-3"
    made.mkdir()
    assert storage.take_empty_snapshot(made, metadata={}).batch_id == -1
    assert storage.read_metadata(made)["spark"]["batch_id"] == -1


def test_a_snapshot_in_place_that_fails_leaves_no_metadata(live, tmp_path):
    target = tmp_path / "chk-9"
    target.mkdir()
    with pytest.raises(SnapshotError):
        storage.take_snapshot(live, target, batch_id=5, metadata={})
    assert list(target.iterdir()) == []


def test_file_deleted_by_spark_while_copying_fails_and_leaves_nothing(live, tmp_path, monkeypatch):
    real_link = os.link

    def maintenance_races(src, dst):
        if str(src).endswith("0/2.delta"):
            os.unlink(src)  # Spark's maintenance deletes it between our listing and the link
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", maintenance_races)
    # Batch 3's state (version 4) is only reachable through 2.delta: the snapshot cannot be taken.
    with pytest.raises(SnapshotError, match=r"state version 2 is missing.*minBatchesToRetain"):
        storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live"], "no target, no .inprogress leftover"


def test_old_logs_deleted_by_spark_while_copying_do_not_fail_the_snapshot(live, tmp_path, monkeypatch):
    # A busy query: Spark's maintenance deletes the oldest retained batch's logs during the copy
    # (seen on a query with a batch every second, 100 batches retained). Batch 3 does not need them.
    real_copy = shutil.copyfile

    def maintenance_races(src, dst):
        if Path(src).parent.name in ("offsets", "commits") and Path(src).name == "0":
            os.unlink(src)
        return real_copy(src, dst)

    monkeypatch.setattr(shutil, "copyfile", maintenance_races)
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    spark = Path(info.path) / storage.SPARK_DIR
    assert not (spark / "offsets" / "0").exists() and (spark / "offsets" / "3").is_file()
    assert (spark / "commits" / "3").is_file() and (spark / "commits" / "2").is_file()


def test_the_newest_logs_vanishing_still_fails(live, tmp_path, monkeypatch):
    real_copy = shutil.copyfile

    def maintenance_races(src, dst):
        if Path(src).parent.name == "offsets" and Path(src).name == "2":
            os.unlink(src)
        return real_copy(src, dst)

    monkeypatch.setattr(shutil, "copyfile", maintenance_races)
    with pytest.raises(SnapshotError, match=r"offsets/2 vanished while taking the snapshot"):
        storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})


def test_a_hole_in_the_delta_chain_is_refused(tmp_path):
    live = fake_live(tmp_path / "live", committed=6, planned=6)
    os.unlink(live / "state" / "0" / "1" / "3.delta")
    with pytest.raises(SnapshotError, match=r"state/0/1: state version 3 is missing.*present up to 6: 1-2, 4-6"):
        storage.take_snapshot(live, tmp_path / "chk", batch_id=5, metadata={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live"]
    # the hole is below a full snapshot: not needed
    write(live / "state" / "0" / "1" / "4.snapshot", "full")
    storage.take_snapshot(live, tmp_path / "chk", batch_id=5, metadata={})


def test_deltas_cleaned_up_below_a_snapshot_are_not_a_hole(tmp_path):
    live = fake_live(tmp_path / "live", committed=15, planned=15, first_delta=11, snapshots=(10,))
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=14, metadata={})
    assert names(Path(info.path) / "spark", "state/0/0")[0] == "11.delta"
    with pytest.raises(SnapshotError, match="state version 9 is missing"):
        storage.take_snapshot(live, tmp_path / "old", batch_id=8, metadata={})


# ---------------------------------------------------------------- metadata


def test_metadata_describes_the_snapshot(live, tmp_path):
    caller = {"job_id": "ab" * 16, "kind": "checkpoint", "checkpoint_id": 7, "format": "ignored"}
    info = storage.take_snapshot(live, tmp_path / "chk-7", batch_id=3, metadata=caller)
    meta = storage.read_metadata(info.path)
    assert meta == info.metadata
    assert meta["job_id"] == "ab" * 16 and meta["checkpoint_id"] == 7
    assert meta["format"] == storage.FORMAT
    spark = meta["spark"]
    assert spark["batch_id"] == 3 and info.batch_id == 3
    assert spark["watermark_ms"] == 3000
    assert spark["conf"] == CONF
    assert spark["source_offsets"] == ['{"i": 400}', "-"] and info.source_offsets == ('{"i": 400}', "-")
    assert spark["operators"] == [
        {
            "id": 0,
            "name": "stateStoreSave",
            "stores": [{"name": "default", "partitions": 2, "key_schema": KEY_SCHEMA, "value_schema": VALUE_SCHEMA}],
        }
    ]
    assert spark["state_partitions"] == 2
    assert meta["size_bytes"] == info.state_size and meta["files"] == info.files
    assert meta["completed_at"] > 0
    assert str(tmp_path) not in (Path(info.path) / "_metadata").read_text()


def test_state_partitions_fall_back_to_the_pinned_conf(tmp_path):
    live = fake_live(tmp_path / "live", committed=1, planned=1, operators=())
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=1, metadata={})
    assert info.metadata["spark"]["operators"] == []
    assert info.metadata["spark"]["state_partitions"] == 2


def test_state_operators_without_operator_metadata_still_count_partitions(tmp_path):
    live = fake_live(tmp_path / "live", committed=1, planned=1, operators=(0, 1), partitions=3)
    os.unlink(live / "state" / "1" / "_metadata" / "metadata")
    ops = storage.state_operators(live)
    assert [(o["id"], o["name"]) for o in ops] == [(0, "stateStoreSave"), (1, None)]
    assert ops[1]["stores"] == [
        {"name": "default", "partitions": 3, "key_schema": KEY_SCHEMA, "value_schema": VALUE_SCHEMA}
    ]


def test_empty_snapshot_restores_as_a_fresh_start(tmp_path):
    info = storage.take_empty_snapshot(tmp_path / "chk-1", metadata={"kind": "savepoint"})
    assert info.batch_id == -1 and info.files == 0
    assert storage.read_metadata(info.path)["spark"]["batch_id"] == -1
    storage.restore(info.path, tmp_path / "live")
    assert list((tmp_path / "live").iterdir()) == []


# ---------------------------------------------------------------- paths


def test_paths_in_every_form(live, tmp_path):
    path = Path(storage.take_snapshot(live, tmp_path / "sp", batch_id=3, metadata={}).path)
    for form in (
        path,
        str(path),
        path / "_metadata",
        f"file://{path}",
        f"file:{path}/_metadata",
        f"file://localhost{path}",
    ):
        assert storage.resolve_snapshot(form) == path
    spaced = tmp_path / "with space"
    storage.take_snapshot(live, spaced, batch_id=3, metadata={})
    assert storage.resolve_snapshot("file://" + str(spaced).replace(" ", "%20")) == spaced


def test_not_snapshots_are_refused_with_the_reason(live, tmp_path):
    with pytest.raises(SnapshotError, match="does not exist"):
        storage.read_metadata(tmp_path / "nope")
    with pytest.raises(SnapshotError, match="holds no _metadata"):
        storage.read_metadata(live)
    with pytest.raises(SnapshotError, match="scheme 's3' is not supported"):
        storage.read_metadata("s3://bucket/savepoint")
    with pytest.raises(SnapshotError, match="host 'other'"):
        storage.read_metadata("file://other/savepoint")
    bad = tmp_path / "bad"
    write(bad / "_metadata", '{"format": "flink-1"}')
    (bad / "spark").mkdir()
    with pytest.raises(SnapshotError, match="format 'flink-1' is not 'headrace-snapshot/1'"):
        storage.read_metadata(bad)
    write(bad / "_metadata", "{not json")
    with pytest.raises(SnapshotError, match="unreadable snapshot metadata"):
        storage.read_metadata(bad)
    damaged = Path(storage.take_snapshot(live, tmp_path / "damaged", batch_id=3, metadata={}).path)
    os.rename(damaged / "spark", tmp_path / "moved-away")
    with pytest.raises(SnapshotError, match="spark/ directory is missing"):
        storage.read_metadata(damaged)


def test_crash_before_the_rename_leaves_only_an_unfinished_dir(live, tmp_path, monkeypatch):
    def crash(*a, **kw):
        raise KeyboardInterrupt  # stands for the process dying while writing _metadata

    monkeypatch.setattr(copying, "_write_json_atomic", crash)  # where take_snapshot writes it
    with pytest.raises(KeyboardInterrupt):
        storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    assert not (tmp_path / "chk").exists()
    # a writer killed outright leaves its hidden work dir: never mistaken for a snapshot
    unfinished = tmp_path / f".chk{storage.INPROGRESS}00112233aabb"
    (unfinished / "spark").mkdir(parents=True)
    with pytest.raises(SnapshotError, match="unfinished snapshot"):
        storage.resolve_snapshot(unfinished)


def test_new_savepoint_dir_follows_flinks_naming(tmp_path):
    a = storage.new_savepoint_dir(f"file://{tmp_path}", "0123456789abcdef0123456789abcdef")
    b = storage.new_savepoint_dir(tmp_path, "0123456789abcdef0123456789abcdef")
    assert a.parent == tmp_path and not a.exists()
    assert a.name.startswith("savepoint-012345-") and len(a.name) == len("savepoint-012345-") + 12
    assert a != b


# ---------------------------------------------------------------- restore and dispose


def test_restore_materialises_the_snapshot(live, tmp_path):
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={"kind": "checkpoint"})
    target = tmp_path / "attempt-2" / "query"
    meta = storage.restore(info.path, target)
    assert meta["kind"] == "checkpoint"
    assert storage.latest_committed_batch(target) == 3
    snap = Path(info.path) / "spark"
    restored = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert restored == sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())
    same = lambda rel: os.stat(snap / rel).st_ino == os.stat(target / rel).st_ino  # noqa: E731
    assert same("state/0/0/4.delta")
    assert not same("offsets/3") and not same("commits/3") and not same("metadata")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_restore_into_an_existing_empty_dir_and_dropping_operators(tmp_path):
    live = fake_live(tmp_path / "live", committed=3, planned=3, operators=(0, 1))
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    target = tmp_path / "target"
    target.mkdir()
    storage.restore(f"file://{info.path}/_metadata", target, drop_operators=[1])
    assert sorted(p.name for p in (target / "state").iterdir()) == ["0"]


def test_restore_never_writes_into_a_used_directory(live, tmp_path):
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    with pytest.raises(SnapshotError, match=r"live is not empty: a snapshot is restored only into a new, empty"):
        storage.restore(info.path, live)
    with pytest.raises(SnapshotError, match="holds no _metadata"):
        storage.restore(live, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_dispose(live, tmp_path):
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    with pytest.raises(SnapshotError, match="not a snapshot .*refusing to delete"):
        storage.dispose(live)
    assert (live / "offsets").is_dir()
    storage.dispose(f"file://{info.path}")
    assert not Path(info.path).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live"], "nothing left, not even a hidden dir"
    storage.dispose(info.path)  # already gone
    flink = tmp_path / "savepoint-flink"
    write(flink / "_metadata", b"\xca\xfe binary Flink metadata")
    with pytest.raises(SnapshotError, match="is not 'headrace-snapshot/1' metadata; refusing to delete"):
        storage.dispose(flink)
    assert flink.is_dir()
    # the state files the snapshot shared with the live checkpoint are still there
    assert (live / "state" / "0" / "0" / "4.delta").read_text() == "delta 0/0/4"


def test_restore_of_a_damaged_snapshot_fails_and_leaves_nothing(live, tmp_path, monkeypatch):
    info = storage.take_snapshot(live, tmp_path / "chk", batch_id=3, metadata={})
    real_link = os.link

    def lose_a_file(src, dst):  # the file disappears after the listing, as under a careless rm
        os.unlink(src)
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", lose_a_file)
    with pytest.raises(SnapshotError, match=r"\.delta is missing: the snapshot is damaged"):
        storage.restore(info.path, tmp_path / "target")
    assert not (tmp_path / "target").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
