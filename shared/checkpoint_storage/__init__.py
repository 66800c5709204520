"""Checkpoint storage: the only code that reads or writes snapshot directories.

A snapshot (a completed checkpoint or a savepoint) is a directory:

    <snapshot>/_metadata     JSON, self-describing; written last, so its presence means "complete"
    <snapshot>/spark/...     a consistent copy of one query's Spark checkpoint at batch b

How a consistent copy is taken while the query runs (Spark's files are write-once: written to a
hidden temporary file, then renamed into place; only Spark's maintenance deletes them):
  * batch b is committed once `commits/b` exists; `offsets/k`, `commits/k` for k <= b and the
    `sources/<i>/<k>` logs are tiny and copied;
  * state store files are versioned by batch + 1 (`<v>.delta`/`.snapshot` for the HDFS-backed
    store, `<v>.zip`/`.changelog` plus shared `SSTs/*.sst` for RocksDB). Versions above b + 1
    belong to a batch still in flight and are left out; the rest are hard-linked (copied where
    the filesystem cannot link), which is safe because nobody ever writes into an existing file;
  * a file deleted by Spark's maintenance while we copy, or a version chain with a hole, means
    batch b is older than `spark.sql.streaming.minBatchesToRetain` allows: SnapshotError.
Hidden files (`.<name>.crc` checksums, temporary files) are skipped: Spark reads a file without
its checksum file, and a restore was tested to work without them.

Everything is written under a hidden sibling `.<name>.inprogress-<hex>` and renamed to its final
name at the end, so a crash never leaves a half snapshot under a name someone could restore from.
No absolute path is stored inside, so a snapshot directory can be moved and still restored.

No pyspark here: this package works on files only, so the JobManager and the dispatcher use it too.

Modules: layout (names, metadata, paths), spark_files (reading a live Spark checkpoint),
copying (taking a snapshot, restoring one) and disposal; this package re-exports their public names.
"""

from shared.checkpoint_storage.copying import check_state_chains, restore, take_empty_snapshot, take_snapshot
from shared.checkpoint_storage.disposal import dispose
from shared.checkpoint_storage.layout import (
    FORMAT,
    INPROGRESS,
    METADATA_FILE,
    SPARK_DIR,
    SnapshotError,
    SnapshotInfo,
    dir_size,
    local_path,
    new_savepoint_dir,
    read_metadata,
    resolve_snapshot,
)
from shared.checkpoint_storage.spark_files import (
    END_OF_TIME_MS,
    latest_committed_batch,
    latest_planned_batch,
    log_final_watermark_batch,
    spark_conf_at,
    state_operators,
)

__all__ = [
    "END_OF_TIME_MS",
    "FORMAT",
    "INPROGRESS",
    "METADATA_FILE",
    "SPARK_DIR",
    "SnapshotError",
    "SnapshotInfo",
    "check_state_chains",
    "dir_size",
    "dispose",
    "latest_committed_batch",
    "latest_planned_batch",
    "local_path",
    "log_final_watermark_batch",
    "new_savepoint_dir",
    "read_metadata",
    "resolve_snapshot",
    "restore",
    "spark_conf_at",
    "state_operators",
    "take_empty_snapshot",
    "take_snapshot",
]
