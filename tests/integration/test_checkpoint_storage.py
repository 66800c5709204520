"""Checkpoint storage against real Spark checkpoints (one SparkSession for the module).

Exactness is checked with update-mode counts: every batch emits the cumulative count of each key
it touched, so a restored query that lost state emits too little and one that replayed a batch
on top of restored state emits too much.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
from collections import Counter
from pathlib import Path

import pytest

from services.taskmanager.runtime.connectors.datagen import generate_events
from services.taskmanager.runtime.spark_session import build_spark
from shared import checkpoint_storage as storage
from tests.waiting import wait_for

KEYS = 5
DATAGEN = {"seed": "7", "partitions": "1", "total": "500", "max_rows_per_batch": "100"}


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_spark(1, tmp_path_factory.mktemp("spark"), shuffle_partitions=2)
    # Spark's clean-up as aggressive as it gets, so the immutability test sees it at work.
    session.conf.set("spark.sql.streaming.minBatchesToRetain", "2")
    session.conf.set("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
    yield session
    session.stop()


class Recorder:
    """foreachBatch sink keeping what each batch emitted, per run."""

    def __init__(self):
        self.batches: dict[str, dict[int, dict]] = {}

    def sink(self, run: str, select):
        def write(df, batch_id: int) -> None:
            rows = select(df).collect()
            self.batches.setdefault(run, {})[batch_id] = {tuple(r[:-1]): r[-1] for r in rows}

        return write


def wait_while_running(query, what: str, check, timeout_s: float):
    """wait_for `check`, except that a streaming query that failed ends the wait at once with its error."""

    def checked():
        if query.exception() is not None:
            raise query.exception()
        return check()

    return wait_for(what, checked, timeout_s, poll_s=0.05)


def sha256_tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def timed(name: str, fn, *args, **kw):
    """Run fn and print how long it took (visible with pytest -s)."""
    t0 = time.perf_counter()
    result = fn(*args, **kw)
    print(f"{name}: {(time.perf_counter() - t0) * 1000:.1f} ms", flush=True)
    return result


# ---------------------------------------------------------------- queries


def windowed_counts(spark, live: Path, rec: Recorder, run: str, **opts):
    """Per (1-minute window, url) counts of the deterministic datagen stream (Python source)."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("datagen")
        .options(**{**DATAGEN, **opts})
        .load()
        .withWatermark("event_time", "10 seconds")
        .groupBy(F.window("event_time", "1 minute"), "url")
        .count()
    )
    select = lambda d: d.select(F.col("window.start").cast("long"), "url", "count")  # noqa: E731
    return (
        df.writeStream.foreachBatch(rec.sink(run, select))
        .outputMode("update")
        .option("checkpointLocation", str(live))
        .start()
    )


def expected_windowed_counts(total: int) -> dict:
    counts: Counter = Counter()
    for e in generate_events(int(DATAGEN["seed"]), 0, total):
        w = int(e["event_time"].timestamp()) // 60 * 60
        counts[(w, e["url"])] += 1
    return dict(counts)


def modulo_counts(spark, live: Path, rec: Recorder, run: str):
    """Count and max of value % KEYS over Spark's built-in rate source (which keeps a sources/
    log). Its values are 0, 1, 2, ... so, with nothing lost or doubled, every emitted key has
    count == max // KEYS + 1."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .option("numPartitions", 1)
        .load()
        .groupBy((F.col("value") % KEYS).alias("k"))
        .agg(F.max("value").alias("max"), F.count("*").alias("count"))
    )
    select = lambda d: d.select("k", "max", "count")  # noqa: E731
    return (
        df.writeStream.foreachBatch(rec.sink(run, select))
        .outputMode("update")
        .option("checkpointLocation", str(live))
        .start()
    )


def assert_modulo_counts_exact(batches: dict[int, dict]) -> None:
    assert batches
    for batch_id, rows in batches.items():
        for (k, max_value), count in rows.items():
            assert count == max_value // KEYS + 1, f"batch {batch_id}, key {k}: {count} rows up to value {max_value}"


# ---------------------------------------------------------------- 1: resume exactly


@pytest.fixture(scope="module")
def datagen_snapshot(spark, tmp_path_factory):
    """A snapshot taken while the windowed count runs (paced, so it is mid-stream)."""
    base = tmp_path_factory.mktemp("datagen")
    live, rec = base / "live-1", Recorder()
    q = windowed_counts(spark, live, rec, "first", rows_per_second="150")
    try:
        batch = wait_while_running(
            q,
            "batch 2 to commit",
            lambda: (storage.latest_committed_batch(live) or 0) >= 2 and storage.latest_committed_batch(live),
            120,
        )
        info = timed(
            "take_snapshot (datagen, running)",
            storage.take_snapshot,
            live,
            base / "chk-1",
            batch_id=batch,
            metadata={"job_id": "j" * 32, "kind": "checkpoint", "checkpoint_id": 1},
        )
    finally:
        q.stop()
    return info, rec, base


def test_restored_query_resumes_after_the_snapshot_batch_and_counts_exactly(spark, datagen_snapshot, tmp_path):
    info, rec, _base = datagen_snapshot
    b = info.batch_id
    assert info.metadata["spark"]["batch_id"] == b
    assert info.metadata["spark"]["state_partitions"] == 2
    assert [op["name"] for op in info.metadata["spark"]["operators"]] == ["stateStoreSave"]
    assert not any(p.name.endswith(".crc") for p in Path(info.path).rglob("*"))

    live2 = tmp_path / "live-2"
    meta = timed("restore (datagen)", storage.restore, info.path, live2)
    assert meta["checkpoint_id"] == 1 and meta["job_id"] == "j" * 32
    q = windowed_counts(spark, live2, rec, "second")  # unpaced: every event available now
    try:
        q.processAllAvailable()
        first = q.recentProgress[0]["batchId"]
    finally:
        q.stop()
    assert q.exception() is None
    assert first == b + 1
    assert min(rec.batches["second"]) == b + 1

    merged: dict = {}
    for batch_id in sorted(k for k in rec.batches["first"] if k <= b):
        merged.update(rec.batches["first"][batch_id])
    for batch_id in sorted(rec.batches["second"]):
        merged.update(rec.batches["second"][batch_id])
    assert merged == expected_windowed_counts(int(DATAGEN["total"]))


# ---------------------------------------------------------------- 2 + 3: immutable, relocatable


@pytest.fixture(scope="module")
def maintained_snapshot(spark, tmp_path_factory):
    """A snapshot taken while a query runs, then 20+ more batches of Spark clean-up in `live`."""
    base = tmp_path_factory.mktemp("immutable")
    live, rec = base / "live", Recorder()
    q = modulo_counts(spark, live, rec, "first")
    try:
        batch = wait_while_running(
            q,
            "batch 2 to commit",
            lambda: (storage.latest_committed_batch(live) or 0) >= 2 and storage.latest_committed_batch(live),
            120,
        )
        info = timed(
            "take_snapshot (rate, running)",
            storage.take_snapshot,
            live,
            base / "chk-1",
            batch_id=batch,
            metadata={"kind": "savepoint"},
        )
        before = sha256_tree(Path(info.path))
        snap = Path(info.path) / storage.SPARK_DIR
        linked = [
            p
            for p in (live / "state").rglob("*.delta")
            if (snap / p.relative_to(live)).exists() and os.stat(p).st_ino == os.stat(snap / p.relative_to(live)).st_ino
        ]
        wait_while_running(q, "20 more batches", lambda: (storage.latest_committed_batch(live) or 0) >= batch + 20, 240)
        # Spark deletes old files in its maintenance thread: give it a moment beyond the commits
        # (the test then says what was not deleted).
        try:
            wait_while_running(
                q,
                "Spark's clean-up",
                lambda: not (live / "offsets" / str(batch)).exists() and any(not p.exists() for p in linked),
                30,
            )
        except AssertionError:
            pass
    finally:
        q.stop()
    return info, before, linked, rec, base


def test_snapshot_files_unchanged_after_spark_maintenance(maintained_snapshot):
    info, before, linked, _rec, _base = maintained_snapshot
    assert linked, "the snapshot shares no state file with the live checkpoint (hard links not used)"
    assert not (Path(info.path).parent / "live" / "offsets" / str(info.batch_id)).exists(), (
        "Spark's clean-up did not delete the snapshot batch's offset log from the live checkpoint"
    )
    deleted = [p for p in linked if not p.exists()]
    assert deleted, "Spark's maintenance deleted none of the state files the snapshot links"
    assert sha256_tree(Path(info.path)) == before
    assert storage.read_metadata(info.path)["spark"]["batch_id"] == info.batch_id


def test_moved_snapshot_restores_and_resumes(spark, maintained_snapshot, tmp_path):
    info, _before, _linked, rec, base = maintained_snapshot
    b = info.batch_id
    elsewhere = tmp_path / "moved" / "my-savepoint"
    elsewhere.parent.mkdir()
    shutil.move(info.path, elsewhere)
    assert not Path(info.path).exists()

    live = tmp_path / "restored-live"
    timed("restore (rate, moved)", storage.restore, f"file://{elsewhere}", live)
    q = modulo_counts(spark, live, rec, "moved")
    try:
        wait_while_running(q, "3 batches after restore", lambda: len(rec.batches.get("moved", {})) >= 3, 120)
    finally:
        q.stop()
    assert min(rec.batches["moved"]) == b + 1
    assert_modulo_counts_exact(rec.batches["moved"])
    assert_modulo_counts_exact(rec.batches["first"])
    assert (live / "sources" / "0" / "0").is_file()


# ---------------------------------------------------------------- 4: path forms and refusals


def test_snapshot_paths_accepted_in_every_form(datagen_snapshot):
    info, _rec, _base = datagen_snapshot
    path = Path(info.path)
    for form in (path, str(path), path / "_metadata", f"file://{path}", f"file://{path}/_metadata", f"file:{path}"):
        assert storage.resolve_snapshot(form) == path
        assert storage.read_metadata(form)["spark"]["batch_id"] == info.batch_id
    meta = storage.read_metadata(path)
    assert meta["format"] == storage.FORMAT
    assert str(path) not in (path / "_metadata").read_text()  # relocatable: no absolute path inside


def test_random_and_unfinished_directories_are_refused(datagen_snapshot, tmp_path):
    info, _rec, base = datagen_snapshot
    with pytest.raises(storage.SnapshotError, match="holds no _metadata"):
        storage.read_metadata(tmp_path)
    unfinished = tmp_path / f".chk-2{storage.INPROGRESS}0123456789ab"
    shutil.copytree(Path(info.path) / "spark", unfinished / "spark")
    with pytest.raises(storage.SnapshotError, match="unfinished snapshot"):
        storage.resolve_snapshot(unfinished)
    with pytest.raises(storage.SnapshotError, match="refusing to delete"):
        storage.dispose(unfinished)
    assert unfinished.exists()
    with pytest.raises(storage.SnapshotError, match="refusing to delete"):
        storage.dispose(tmp_path)
    with pytest.raises(storage.SnapshotError, match="not empty"):
        storage.restore(info.path, base / "live-1")


def test_dispose_deletes_a_snapshot_and_is_idempotent(datagen_snapshot, tmp_path):
    info, _rec, _base = datagen_snapshot
    copy = tmp_path / "savepoint-copy"
    shutil.copytree(info.path, copy)
    storage.dispose(f"file://{copy}")
    assert not copy.exists() and list(tmp_path.iterdir()) == []
    storage.dispose(copy)  # already gone: nothing to do
    assert Path(info.path, "_metadata").is_file()


def test_checkpoints_are_written_without_a_process_per_file_and_with_hadoops_modes(spark, tmp_path):
    # Hadoop's own local file system forks chmod for every file it creates (no native library);
    # Headrace's (shared/local_fs_jar.py, built by scripts/bootstrap) sets the same modes in-process.
    jvm = spark.sparkContext._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(spark.sparkContext._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == "io.headrace.fs.NioLocalFileSystem", "run scripts/bootstrap: it builds the jar"
    context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(spark.sparkContext._jsc.hadoopConfiguration())
    assert context.getDefaultFileSystem().getClass().getName() == "io.headrace.fs.NioLocalFs"
    cp = tmp_path / "cp"
    q = (
        spark.readStream.format("datagen")
        .options(**DATAGEN)
        .load()
        .groupBy("url")
        .count()
        .writeStream.outputMode("update")
        .foreachBatch(lambda df, _id: df.collect())
        .trigger(availableNow=True)
        .option("checkpointLocation", str(cp))
        .start()
    )
    assert q.awaitTermination(120), "the query did not end within 120 s"
    files = [p for p in cp.rglob("*") if p.is_file() and not p.name.endswith(".crc")]
    assert any(p.parent.name == "commits" for p in files), sorted(map(str, files))
    # umask 002 (spark_session: the drivers' group shares what a task writes)
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o664"}, [(str(p), oct(p.stat().st_mode)) for p in files]
    dirs = [p for p in cp.rglob("*") if p.is_dir()]
    assert {oct(p.stat().st_mode & 0o777) for p in dirs} == {"0o775"}, [(str(p), oct(p.stat().st_mode)) for p in dirs]


def test_a_directory_made_below_a_setgid_directory_keeps_the_bit(spark, tmp_path):
    # The lake directory is setgid so that what the drivers make there keeps their group; chmod(1)
    # keeps a directory's setgid bit where the chmod(2) of java.nio would clear it.
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    lake = tmp_path / "lake"
    lake.mkdir()
    lake.chmod(0o2775)
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(conf)
    assert fs.mkdirs(jvm.org.apache.hadoop.fs.Path(f"file://{lake}/table/_delta_log"))
    context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(conf)
    context.mkdir(jvm.org.apache.hadoop.fs.Path(f"file://{lake}/table/part=1"), None, True)
    for made in ("table", "table/_delta_log", "table/part=1"):
        mode = (lake / made).stat().st_mode
        assert mode & stat.S_ISGID and mode & 0o777 == 0o775, (made, oct(mode))
