"""File sink (parquet, csv, json).

Batch (bounded) writes use Spark's batch writer with the given `mode`, as they always did.

Streaming uses a foreachBatch sink of our own instead of Spark's file sink, whose
`_spark_metadata` log is keyed by batch id and can neither be rewound nor fenced. Its
bookkeeping lives under `<path>/_headrace/` (readers skip `_`-prefixed entries, see below):

    lock                  fcntl.flock'ed around every commit and every prepare
    commits/<b>.json      batch b is committed: its attempt and the files it added
    staging/a<a>-b<b>-<hex>/   where attempt a writes batch b before committing it

and its owner and fence where no pipeline can write them: in a task of a TaskManager, the
TaskManager keeps them (services/taskmanager/tasks/sink_claims.py) and hands the directory to the task
only once it may have it (`grants.claim_directory`):

    fence                 {"attempt", "restored_batch_id"}: the attempt holding the sink
    owner                 {"lineage", "job_id", "generation", "replaced"}: the lineage owning
                          the directory, its latest job and the jobs that one replaced

(A sink used outside a TaskManager's driver, by a test or a tool, keeps them as `fence.json` and
`owner.json` in `_headrace/` itself, as Headrace did before.)

Batch b of attempt a: Spark's batch writer writes the DataFrame into a fresh staging dir; then,
under the lock, the sink checks that the fence still names a (else `SinkFencedError`, nothing
moves), skips the batch if `commits/<b>.json` exists (a re-run in the same lineage), else
renames the data files into `<path>/` (keeping partition subdirectories) as
`b<b>-a<a>-<spark's name>` and writes the commit marker (temp file + rename). A marker thus
always means all of its files are in place. Files without rows (Spark writes one for an empty
DataFrame, e.g. a batch that only advanced the watermark) are not kept.

`prepare(attempt, r, owner)` (under the lock): refuses (`SinkOwnedError`, ownership.py) if
the owner is another lineage, refuses if the fence names a newer attempt, sets the fence
and the owner, deletes every marker of a batch > r and the files it lists (that lineage was discarded;
the new attempt re-runs those batches), deletes data files named `b<b>-a<a>-` that no marker
claims (leftovers of an attempt that died mid-commit) and empties `staging/`.

Readers: `spark.read.<format>(path)` and pyarrow datasets ignore `_`- and `.`-prefixed names,
so they see the committed data files only, with two windows: during a commit a listing may see
part of the batch's files (renames are atomic one file at a time), and a batch of a replaced
attempt stays visible until the next attempt's prepare removes it (as would any output a reader
consumed before a failover). A reader wanting whole batches only can list `_headrace/commits/`.
The lock needs a filesystem with working flock (local disks; NFS emulates it with POSIX locks).

A directory written by Spark's own streaming file sink (it has `_spark_metadata/`, which
Spark's readers would trust over the directory listing) is refused: write to a new path. So is
a batch write (`run_batch`) into a directory a streaming lineage owns: its default mode
(overwrite) would delete that lineage's files and bookkeeping.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

from pyspark.sql import DataFrame

from .. import grants
from .ownership import UNKNOWN, SinkOwnedError, SinkOwner, check_claim, replaced_after
from .sinks import SinkFencedError, SinkHandle, flatten_structs

FORMATS = ("parquet", "csv", "json")
_DATA_NAME = re.compile(r"^b(\d+)-a(\d+)-")


class FileSink:
    """Exactly-once, attempt-fenced streaming writes of one output directory (driver side)."""

    def __init__(
        self,
        path: str,
        *,
        format: str = "parquet",
        partition_by: Sequence[str] = (),
        options: dict[str, str] | None = None,
    ):
        if format not in FORMATS:
            raise ValueError(f"file sink format must be one of {FORMATS}, not {format!r}")
        self.path = Path(path)
        self.format = format
        self.partition_by = tuple(partition_by)
        self.options = dict(options or {})
        self.attempt: int | None = None  # the fencing attempt, once prepared
        self.meta = self.path / "_headrace"
        self.record: Path | None = None  # the TaskManager's records of the directory, once claimed

    # -- layout

    @property
    def sink_name(self) -> str:
        return f"files:{self.path}"

    def _marker(self, batch_id: int) -> Path:
        return self.meta / "commits" / f"{batch_id}.json"

    def _ensure_layout(self) -> None:
        if (self.path / "_spark_metadata").exists():
            raise ValueError(
                f"file sink: {self.path} was written by Spark's streaming file sink (it has "
                f"_spark_metadata/, which Spark's readers trust over the files themselves, so new "
                f"files would be invisible to them); write this job to a new directory, or move "
                f"the old output away and delete _spark_metadata/"
            )
        for d in ("commits", "staging"):
            (self.meta / d).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialises commits and prepares of every process writing this directory."""
        with open(self.meta / "lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _read_fence(self) -> dict[str, Any] | None:
        try:
            if self.record is not None:
                return json.loads(self.record.read_text()).get("fence")
            return json.loads((self.meta / "fence.json").read_text())
        except FileNotFoundError:
            return None

    def _read_owner(self) -> tuple[SinkOwner | None, list[str]]:
        """The owner and the job ids it replaced."""
        try:
            rec = json.loads((self.meta / "owner.json").read_text())
        except FileNotFoundError:
            return None, []
        return SinkOwner.from_record(rec), list(rec.get("replaced", []))

    @property
    def release_hint(self) -> str:
        return (
            f"cancel the owner's job, then delete the directory (`rm -rf {self.path}`; "
            f"this deletes its output) or move it away"
        )

    def _check_fence(self) -> None:
        if self.attempt is None:
            return
        fence = self._read_fence()
        holder = fence["attempt"] if fence else None
        if holder != self.attempt:
            raise SinkFencedError(self.sink_name, self.attempt, holder)

    # -- fencing

    def prepare(self, attempt: int, restored_batch_id: int, owner: SinkOwner | None = None) -> None:
        """Take the directory over for `attempt` restored at Spark batch `restored_batch_id`
        and remove what the discarded run and crashed commits left (module docstring).
        With `owner`, refuse (SinkOwnedError) a directory another lineage owns."""
        # Set first: after a failed prepare the sink must refuse to write, not write unfenced.
        self.attempt = attempt
        r = restored_batch_id
        channel = grants.current()
        if channel is not None:
            # Made as this task's user (where it may not, it fails here), then claimed: the
            # TaskManager decides on the owner and the fence, and hands the directory over.
            self.path.mkdir(parents=True, exist_ok=True)
            self.record = Path(
                channel.claim_directory(str(self.path), kind="streaming", attempt=attempt, restored_batch_id=r)
            )
            self._ensure_layout()
            with self._locked():
                self._rewind(r)
            return
        self._ensure_layout()
        with self._locked():
            current, replaced = self._read_owner()
            if owner is not None:
                check_claim(
                    "directory",
                    str(self.path),
                    owner,
                    current,
                    restored_batch_id=r,
                    has_commits=any((self.meta / "commits").glob("*.json")),
                    release=self.release_hint,
                    replaced=replaced,
                )
            fence = self._read_fence()
            if fence is not None and fence["attempt"] > attempt:
                raise SinkFencedError(self.sink_name, attempt, fence["attempt"])
            _write_json(self.meta / "fence.json", {"attempt": attempt, "restored_batch_id": r})
            if owner is not None:
                _write_json(
                    self.meta / "owner.json", owner.record() | {"replaced": replaced_after(owner, current, replaced)}
                )
            self._rewind(r)

    def _rewind(self, r: int) -> None:
        """Under the lock: remove what batches after `r`, crashed commits and staging left."""
        kept: set[tuple[int, int]] = set()
        for marker in sorted((self.meta / "commits").glob("*.json")):
            commit = json.loads(marker.read_text())
            if commit["batch_id"] > r:
                for rel in commit["files"]:
                    (self.path / rel).unlink(missing_ok=True)
                marker.unlink()
            else:
                kept.add((commit["batch_id"], commit["attempt"]))
        for f in self._data_files():
            m = _DATA_NAME.match(f.name)
            if m and (int(m.group(1)), int(m.group(2))) not in kept:
                f.unlink()
        for staged in (self.meta / "staging").iterdir():
            shutil.rmtree(staged, ignore_errors=True)
        for tmp in (self.meta / "commits").glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    def refuse_if_owned(self) -> None:
        """For batch writes: a directory a streaming lineage prepared is that lineage's alone (in
        a TaskManager's driver: claimed as a batch output, refused if it is such a directory)."""
        channel = grants.current()
        if channel is not None:
            channel.claim_directory(str(self.path), kind="batch")
            return
        if not (self.meta / "fence.json").exists() and not (self.meta / "owner.json").exists():
            return
        current, _ = self._read_owner()
        lineage, job = (current.lineage, current.job_id) if current else (UNKNOWN, UNKNOWN)
        raise SinkOwnedError("directory", str(self.path), lineage, job, "a batch write", self.release_hint)

    def _data_files(self) -> Iterator[Path]:
        """Files of the output (partition subdirectories included), bookkeeping excluded."""
        for root, dirs, files in os.walk(self.path):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            for name in files:
                yield Path(root) / name

    # -- writing

    def write_batch(self, df: DataFrame, batch_id: int) -> bool:
        """foreachBatch entry point: False when the batch was already committed (nothing
        written); SinkFencedError (nothing written) when a newer attempt holds the sink."""
        self._ensure_layout()
        flat = flatten_structs(df)
        if self._marker(batch_id).exists():
            self._check_fence()
            # Pitfall: a foreachBatch that does not evaluate its DataFrame fails the query with
            # STATE_STORE_COMMIT_VALIDATION_FAILED, so the skip path still runs it into `noop`.
            flat.write.format("noop").mode("overwrite").save()
            return False
        self._check_fence()  # fail early; the check that counts is the one under the lock
        attempt = self.attempt if self.attempt is not None else 0
        staging = self.meta / "staging" / f"a{attempt}-b{batch_id}-{uuid.uuid4().hex[:12]}"
        try:
            writer = flat.write.format(self.format).mode("errorifexists").options(**self.options)
            if self.partition_by:
                writer = writer.partitionBy(*self.partition_by)
            writer.save(str(staging))
            with self._locked():
                self._check_fence()
                if self._marker(batch_id).exists():
                    return False
                moved = []
                for f in _staged_files(staging):
                    if not self._holds_rows(f):
                        continue  # no file per empty batch (e.g. each watermark-only batch)
                    rel = f.relative_to(staging)
                    target = self.path / rel.parent / f"b{batch_id}-a{attempt}-{rel.name}"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(f, target)
                    moved.append(str(target.relative_to(self.path)))
                _write_json(self._marker(batch_id), {"batch_id": batch_id, "attempt": attempt, "files": moved})
            return True
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _holds_rows(self, f: Path) -> bool:
        """False for the row-less file Spark writes for an empty DataFrame (a schema-only
        parquet file, a csv header, an empty json file); True when unsure."""
        size = f.stat().st_size
        if size == 0:
            return False
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.read_metadata(f).num_rows > 0
        if self.format == "csv" and size < 65536 and f.suffix == ".csv":  # not compressed
            with open(f, "rb") as fh:
                lines = [line for line in fh.read().splitlines() if line.strip()]
            header = str(self.options.get("header", "false")).lower() == "true"
            return len(lines) > (1 if header else 0)
        return True


def _staged_files(staging: Path) -> Iterator[Path]:
    """Data files Spark wrote (not `_SUCCESS`, not hidden `.crc` checksums)."""
    for root, dirs, files in os.walk(staging):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in sorted(files):
            if not name.startswith(("_", ".")):
                yield Path(root) / name


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    """Atomically (temp file + rename), durable before the rename makes it visible."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def file_sink(
    df: DataFrame,
    path: str,
    *,
    format: str = "parquet",
    mode: str = "overwrite",
    partition_by: Sequence[str] = (),
    options: dict[str, str] | None = None,
    trigger: str | None = None,
    name: str | None = None,
) -> SinkHandle:
    if format not in FORMATS:
        raise ValueError(f"file sink format must be one of {FORMATS}, not {format!r}")
    opts = dict(options or {})
    if format == "csv":
        opts.setdefault("header", "true")
    flat = flatten_structs(df)
    sink = FileSink(path, format=format, partition_by=partition_by, options=opts)

    def configure(writer):
        return writer.foreachBatch(lambda batch_df, batch_id: sink.write_batch(batch_df, batch_id))

    def run_batch() -> None:
        sink.refuse_if_owned()
        writer = flat.write.format(format).mode(mode).options(**opts)
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.save(path)

    # Append only: each micro-batch adds files (update/complete would need rewriting them).
    return SinkHandle(
        name=name or f"files-{format}",
        df=flat,
        output_mode="append",
        trigger=trigger,
        configure=configure,
        run_batch=run_batch,
        on_prepare=sink.prepare,
    )
