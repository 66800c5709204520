"""A snapshot that cannot be restored, told apart from every other task failure.

The driver restores an attempt's snapshot (checkpoint or savepoint) before its query starts. When
that fails because the snapshot itself is damaged (a file missing, truncated or unreadable), a
restart from the same snapshot fails the same way, restart after restart. So the driver raises
`SnapshotRestoreError`, whose name travels as the failure name of the task's FAILED report, and
the JobManager falls back to the previous retained checkpoint (services/jobmanager/restore_fallback.py).

`verify` checks what can be checked without Spark before anything is copied: every file the
snapshot's metadata counted is there with the bytes it counted, and the offset and commit logs
of the snapshot's batch are readable. No pyspark here: the JobManager imports the names.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from shared.checkpoint_storage import SPARK_DIR, SnapshotError, local_path, resolve_snapshot, spark_conf_at
from shared.errors import StateError


class SnapshotRestoreError(StateError):
    """The snapshot an attempt starts from could not be restored; the message says which and why."""


NAME = SnapshotRestoreError.__name__


@contextlib.contextmanager
def restoring(path: str) -> Iterator[None]:
    """Reading or copying the snapshot at `path`: a damaged snapshot becomes SnapshotRestoreError."""
    try:
        yield
    except SnapshotError as exc:
        raise SnapshotRestoreError(f"the snapshot {path} could not be restored: {exc}") from exc
    except OSError as exc:
        raise SnapshotRestoreError(f"the snapshot {path} could not be read: {exc}") from exc


def _visible_files(root: Path) -> Iterator[Path]:
    # The snapshot holds no hidden file (they are skipped when it is written), so none is counted.
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith("."):
                yield Path(dirpath) / name


def _raise(err: OSError) -> None:
    raise err


def verify(path: str, metadata: dict) -> None:
    """Raise SnapshotError unless the snapshot at `path` still holds what its metadata says."""
    directory = resolve_snapshot(local_path(path))
    spark_dir = directory / SPARK_DIR
    count = size = 0
    for f in _visible_files(spark_dir):
        count += 1
        size += os.lstat(f).st_size
    want_files, want_size = metadata.get("files"), metadata.get("size_bytes")
    if isinstance(want_files, int) and count != want_files:
        raise SnapshotError(
            f"{spark_dir} holds {count} files, its metadata counted {want_files}: files were "
            f"deleted from (or added to) the snapshot"
        )
    if isinstance(want_size, int) and size != want_size:
        raise SnapshotError(
            f"{spark_dir} holds {size} bytes, its metadata counted {want_size}: a file of the "
            f"snapshot was truncated or rewritten"
        )
    batch = int((metadata.get("spark") or {}).get("batch_id", -1))
    if batch >= 0:
        spark_conf_at(spark_dir, batch)  # raises SnapshotError when the offset log is unreadable
        if not (spark_dir / "commits" / str(batch)).is_file():
            raise SnapshotError(f"{spark_dir}: the commit log of batch {batch} is missing")
