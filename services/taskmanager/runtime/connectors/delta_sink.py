"""Delta Lake as an exactly-once sink: append, update (MERGE by key) and complete (overwrite).

Each micro-batch is one Delta commit made in foreachBatch on the driver, with Delta's idempotent
writes: `txnAppId` names the sink (its lineage and table), `txnVersion` the batch and the
attempt's seq (delta_log.py). Delta records both in the same commit and skips a write whose
version it has already passed, so

  * a batch Spark runs again in the same attempt is written once (Delta skips it);
  * an older attempt of the lineage (a driver frozen, then woken after its task moved) writes
    nothing: its seq is lower than the one the newer attempt's fence commit recorded, inside
    Delta's own optimistic transaction; the sink sees the skip and fails that batch with
    SinkFencedError;
  * another lineage is refused before it writes anything (delta_claim.py: SinkOwnedError naming
    the owner), unless every writer opted into shared append.

`prepare(fence, r, owner)` (the runner calls it before the query starts): creates the table if
there is none (the pipeline's schema, `partition_by`), checks the rows fit it (delta_schema.py),
claims the table (delta_claim.py), commits the fence (an empty commit recording the transaction
version seq/r), then undoes this lineage's commits after the version the restored snapshot
recorded (delta_restore.py; the driver's log says what was undone, so do the snapshot metadata
and the RESTORE commit's userMetadata). Every snapshot records the version the sink had
committed at its batch (`on_snapshot`, kept under "sink" in `_metadata`) and pins it against
VACUUM (delta_maintenance.py), which also compacts the table every N batches when asked.

Output modes (delta_write.py makes the commits): `append` adds every row once; `update` MERGEs
each batch into the table by `key_columns` (insert or update, keys compared null-safely; a batch
must hold one row per key, as a stateful aggregate's update output does); `complete` replaces the
table's rows with the batch in one commit. Struct columns are kept (Delta stores nested types).
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any, Callable, Mapping, Sequence

from . import delta_claim, delta_log, delta_restore, delta_schema
from .delta_log_checkpoint import LogCheckpoints, creation_properties
from .delta_maintenance import Maintenance, Pins, Policy
from .delta_write import DeltaWriter
from .ownership import SinkOwnedError, SinkOwner
from .sinks import SinkFencedError, SinkHandle

MODES = ("append", "update", "complete")
# Delta rebuilds a table's snapshot (every commit, MERGE and OPTIMIZE needs one) in this many
# Spark tasks: 50 by default, sized for clusters. A driver of p cores does it in p: each batch
# took 4.5 s instead of 15-25 s, an attempt's take-over 3 s instead of minutes, on 2 loaded cores
# (docs/benchmarks.md, "Delta Lake sink"). A value the pipeline set on its session before
# building the sink wins.
SNAPSHOT_PARTITIONS_CONF = "spark.databricks.delta.snapshotPartitions"
DELTA_DEFAULT_SNAPSHOT_PARTITIONS = "50"
KEPT_BATCHES = 2000  # batch -> version entries kept for snapshots (they lag a few batches at most)


def app_id(lineage: str, path: str) -> str:
    """The sink's transaction app id: stable across a lineage's attempts and jobs."""
    return f"headrace-{lineage}-{hashlib.sha1(path.encode()).hexdigest()[:12]}"


def sink_name(path: str) -> str:
    """The checkpoint subdirectory of the sink's query (stable across attempts)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", path.rstrip("/").rsplit("/", 1)[-1])[:40]
    return f"delta-{base}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"


class DeltaSink:
    """One table written by one streaming query (module docstring); lives on the driver."""

    def __init__(
        self,
        spark: Any,
        path: str,
        *,
        app: str,
        schema: Any,
        output_mode: str = "append",
        key_columns: Sequence[str] = (),
        partition_by: Sequence[str] = (),
        options: Mapping[str, str] | None = None,
        shared_append: bool = False,
        policy: Policy | None = None,
        on_wait: Callable[[str | None], None] | None = None,
    ):
        self.spark, self.path, self.app = spark, path, app
        self.writer = DeltaWriter(
            path,
            app,
            schema,
            output_mode=output_mode,
            key_columns=key_columns,
            partition_by=partition_by,
            options=options,
        )
        self.shared_append = shared_append
        self.fence: int | None = None  # the fencing token of the attempt, once prepare began
        self.seq: int | None = None  # this attempt's seq, once prepared
        self.restored: dict | None = None  # the restored snapshot's "sink" entry (runtime/restore.py)
        self.undone: delta_restore.Undone | None = None
        self.pins = Pins(path, app)
        policy = policy or Policy()
        self.maintenance = Maintenance(path, app, policy, self.pins, on_wait)
        self.log_checkpoints = LogCheckpoints(path, policy.log_checkpoint_every)
        self._versions: dict[int, tuple[int, int]] = {}  # batch (-1: the restore point) -> (version, committed ms)
        self._figures: dict[int, dict[str, int]] = {}
        self._lock = threading.Lock()

    @property
    def sink_name(self) -> str:
        return f"delta:{self.path}"

    # -- taking the table over

    def prepare(self, fence: int, restored_batch_id: int, owner: SinkOwner | None = None) -> None:
        """Claim, fence and rewind the table for the attempt with token `fence`, restored at Spark
        batch `restored_batch_id` (-1: a fresh start). Raises SinkOwnedError, SinkFencedError,
        DeltaSchemaMismatch or DeltaUndoRefused before changing any row."""
        self.fence, self.seq = fence, None  # set first: a failed prepare leaves the sink refusing writes
        spark, r = self.spark, restored_batch_id
        self.writer.ensure_table(spark, creation_properties(self.log_checkpoints.every))
        state = delta_log.table_state(spark, self.path, self.app)
        # Whose table it is first (that refusal says more), then whether the rows fit: both before
        # the claim writes anything.
        delta_claim.new_record(
            self.path,
            self.app,
            state,
            fence=fence,
            owner=owner,
            shared=self.shared_append,
            restored_batch_id=r,
            sink_name=self.sink_name,
        )
        delta_schema.check(self.path, state.schema_json, self.writer.schema, merge_schema=self.writer.merge_schema)
        record = delta_claim.claim(
            spark,
            self.path,
            self.app,
            fence=fence,
            owner=owner,
            shared=self.shared_append,
            restored_batch_id=r,
            sink_name=self.sink_name,
        )
        writers = {
            k: v
            for k, v in delta_log.table_state(spark, self.path, self.app).properties.items()
            if k.startswith(delta_claim.PREFIX)
        }
        self.writer.commit_txn(
            spark, self.writer.empty(spark), delta_log.txn_version(record.seq, r), "append", f"fence r={r}"
        )
        state = delta_log.table_state(spark, self.path, self.app)
        self._check_txn(state, record.seq)
        target = self._restore_point(r, record, state)
        self.undone = delta_restore.undo_after(spark, self.path, self.app, target, state.version)
        if self.undone is not None:
            print(f"delta: {self.undone.describe(self.path)}", flush=True)
            # RESTORE put the table's properties back as they were: the writers' records again.
            self._restore_records(spark, writers)
            state = delta_log.table_state(spark, self.path, self.app)
            self._check_txn(state, record.seq)
        self.seq = record.seq
        with self._lock:
            self._versions = {r: (state.version, state.timestamp_ms)}
        print(f"delta: {self.log_checkpoints.describe(state.properties)}", flush=True)
        self.log_checkpoints.committed(spark, state.version, state.properties)

    def _restore_point(self, r: int, record: delta_claim.WriterRecord, state: delta_log.TableState) -> int:
        m = self.restored or {}
        if (
            m.get("kind") == "delta"
            and m.get("path") == self.path
            and m.get("app_id") == self.app
            and isinstance(m.get("version"), int)
        ):
            return int(m["version"])
        if r < 0:
            return record.since
        return delta_restore.version_at_batch(self.path, self.app, r, record.since, state.version)

    def _restore_records(self, spark: Any, writers: dict[str, str]) -> None:
        if not writers:
            return
        props = ", ".join(f"{delta_log.sql_string(k)} = {delta_log.sql_string(v)}" for k, v in sorted(writers.items()))
        with delta_log.tagged(spark, delta_log.tag(self.app, "claims again after the undo")):
            spark.sql(f"ALTER TABLE {delta_log.quoted(self.path)} SET TBLPROPERTIES ({props})")

    def _check_txn(self, state: delta_log.TableState, seq: int) -> None:
        """Fenced unless the app's transaction version is of `seq`: a newer attempt claimed after us."""
        if delta_log.seq_of(state.txn) != seq:
            raise SinkFencedError(self.sink_name, self.fence if self.fence is not None else -1, self._holder(state))

    def _holder(self, state: delta_log.TableState) -> int | None:
        own = delta_claim.records(state.properties).get(self.app)
        return own.fence if own is not None else None

    # -- writing

    def write_batch(self, df: Any, batch_id: int) -> bool:
        """foreachBatch: False when the batch was already committed (nothing written)."""
        if self.fence is not None and self.seq is None:
            raise SinkFencedError(self.sink_name, self.fence, None)  # its prepare failed
        spark = df.sparkSession
        state = delta_log.table_state(spark, self.path, self.app)
        self._check_owner(state)
        seq = self.seq if self.seq is not None else max(1, delta_log.seq_of(state.txn))
        txn = delta_log.txn_version(seq, batch_id)
        if delta_log.seq_of(state.txn) > seq:
            raise SinkFencedError(self.sink_name, self.fence if self.fence is not None else seq, self._holder(state))
        if state.txn is not None and state.txn >= txn:
            # Pitfall: a foreachBatch that does not evaluate its DataFrame fails the query with
            # STATE_STORE_COMMIT_VALIDATION_FAILED, so the skip path still runs it into `noop`.
            df.write.format("noop").mode("overwrite").save()
            found = delta_log.find_txn(self.path, self.app, txn, max(-1, state.version - 1000), state.version)
            self._record(
                batch_id,
                found.version if found else state.version,
                0,
                found.timestamp_ms if found else state.timestamp_ms,
            )
            return False
        self.writer.write_batch(spark, df, txn, batch_id)
        after = delta_log.table_state(spark, self.path, self.app)
        if after.txn != txn:
            if delta_log.seq_of(after.txn) > seq:  # a newer attempt fenced us while we wrote: Delta skipped it
                raise SinkFencedError(
                    self.sink_name, self.fence if self.fence is not None else seq, self._holder(after)
                )
            raise RuntimeError(
                f"Delta sink {self.path}: batch {batch_id} was written but the table records "
                f"transaction {after.txn} for {self.app}, not {txn}"
            )
        found = delta_log.find_txn(self.path, self.app, txn, state.version, after.version)
        self._record(
            batch_id,
            found.version if found else after.version,
            found.files_added if found else 0,
            found.timestamp_ms if found else after.timestamp_ms,
        )
        self.log_checkpoints.committed(spark, after.version, after.properties)
        self.maintenance.after_batch(spark, batch_id)
        return True

    def _check_owner(self, state: delta_log.TableState) -> None:
        """Between claims, the records only change by hand (a release) or by another claim."""
        if self.fence is None:
            return
        recs = delta_claim.records(state.properties)
        own = recs.pop(self.app, None)
        if own is not None and own.fence > self.fence:
            raise SinkFencedError(self.sink_name, self.fence, own.fence)
        lineage = own.lineage if own is not None else None
        for other, rec in recs.items():
            if rec.lineage != lineage and not (self.shared_append and rec.shared):
                raise SinkOwnedError(
                    "Delta table",
                    self.path,
                    rec.lineage,
                    rec.job_id,
                    f"the sink {self.app}",
                    delta_claim.release_hint(self.path, other),
                )

    def _record(self, batch_id: int, version: int, files_added: int, committed_ms: int) -> None:
        with self._lock:
            self._versions[batch_id] = (version, committed_ms)
            self._figures[batch_id] = {"version": version, "files_added": files_added}
            for table in (self._versions, self._figures):
                while len(table) > KEPT_BATCHES:
                    table.pop(min(table))

    # -- what the runner asks

    def figures(self, batch_id: int) -> dict[str, int] | None:
        with self._lock:
            return self._figures.get(batch_id)

    def on_snapshot(self, batch_id: int | None, kind: str, target: str) -> dict:
        """The snapshot's "sink" entry: the version the sink had committed at its batch, pinned
        against VACUUM while the snapshot exists."""
        with self._lock:
            known = [b for b in self._versions if batch_id is None or b <= batch_id]
            version, committed_ms = self._versions[max(known)] if known else (-1, 0)
        entry: dict[str, Any] = {
            "kind": "delta",
            "path": self.path,
            "app_id": self.app,
            "version": version,
            "batch_id": batch_id,
            "committed_ms": committed_ms,
        }
        if self.undone is not None:
            entry["undone"] = {
                "to_version": self.undone.to_version,
                "batches": list(self.undone.batches),
                "versions": list(self.undone.versions),
                "rows": self.undone.rows,
            }
        if version >= 0:
            try:
                self.pins.add(target, version, committed_ms)
            except OSError as exc:  # the snapshot matters more than its pin; VACUUM's retention still holds
                print(f"delta: could not pin version {version} of {self.path} for {target}: {exc}", flush=True)
        return entry

    # -- bounded jobs

    def write_bounded(self, df: Any) -> None:
        """A batch job's one write (no fence, no transaction version): refused where a streaming
        lineage writes the table, unless both share it by append."""
        spark = self.spark
        if delta_log.table_exists(self.path):
            state = delta_log.table_state(spark, self.path, self.app)
            for other, rec in delta_claim.records(state.properties).items():
                if not (self.shared_append and rec.shared):
                    raise SinkOwnedError(
                        "Delta table",
                        self.path,
                        rec.lineage,
                        rec.job_id,
                        "a batch write",
                        delta_claim.release_hint(self.path, other),
                    )
            delta_schema.check(self.path, state.schema_json, df.schema, merge_schema=self.writer.merge_schema)
        else:
            self.writer.ensure_table(spark, creation_properties(self.log_checkpoints.every))
        self.writer.write_untracked(spark, df)
        after = delta_log.table_state(spark, self.path, self.app)
        self.log_checkpoints.committed(spark, after.version, after.properties)


def delta_sink(
    df: Any,
    path: str,
    *,
    lineage: str,
    output_mode: str = "append",
    key_columns: Sequence[str] = (),
    partition_by: Sequence[str] = (),
    options: Mapping[str, str] | None = None,
    trigger: str | None = None,
    shared_append: bool = False,
    policy: Policy | None = None,
    on_wait: Callable[[str | None], None] | None = None,
) -> SinkHandle:
    """The handle of a Delta sink on the resolved table `path` (delta_paths.py)."""
    if output_mode not in MODES:
        raise ValueError(f"Delta sink output_mode must be one of {MODES}, not {output_mode!r}")
    columns = {f.name.lower(): f.name for f in df.schema.fields}
    missing = [c for c in (*key_columns, *partition_by) if c.lower() not in columns]
    if missing:
        raise ValueError(
            f"Delta sink {path}: key/partition columns {missing} are not among the DataFrame's "
            f"columns {list(columns.values())}"
        )
    if output_mode == "update" and not key_columns:
        raise ValueError(
            f"Delta sink {path}: output_mode='update' MERGEs each micro-batch by key and needs "
            f"key_columns=[...] (the grouping columns of the aggregate)"
        )
    if key_columns and output_mode != "update":
        raise ValueError(
            f"Delta sink {path}: key_columns are for output_mode='update' (MERGE by key); "
            f"{output_mode!r} writes without keys"
        )
    if shared_append and output_mode != "append":
        raise ValueError(
            f"Delta sink {path}: shared_append=True shares the table by appending; "
            f"output_mode {output_mode!r} would rewrite the other writers' rows"
        )
    spark = df.sparkSession
    if spark.conf.get(SNAPSHOT_PARTITIONS_CONF, DELTA_DEFAULT_SNAPSHOT_PARTITIONS) == DELTA_DEFAULT_SNAPSHOT_PARTITIONS:
        spark.conf.set(SNAPSHOT_PARTITIONS_CONF, str(max(1, spark.sparkContext.defaultParallelism)))
    sink = DeltaSink(
        spark,
        path,
        app=app_id(lineage, path),
        schema=df.schema,
        output_mode=output_mode,
        key_columns=key_columns,
        partition_by=partition_by,
        options=options,
        shared_append=shared_append,
        policy=policy,
        on_wait=on_wait,
    )

    def each_batch(batch_df: Any, batch_id: int) -> None:
        sink.write_batch(batch_df, batch_id)

    def on_prepare(fence: int, restored_batch_id: int, owner: SinkOwner | None) -> None:
        sink.restored = handle.restored_sink
        sink.prepare(fence, restored_batch_id, owner)

    handle = SinkHandle(
        name=sink_name(path),
        df=df,
        output_mode=output_mode,
        trigger=trigger,
        configure=lambda writer: writer.foreachBatch(each_batch),
        run_batch=lambda: sink.write_bounded(df),
        options={"format": "delta", "path": path},
        on_prepare=on_prepare,
        on_snapshot=sink.on_snapshot,
        commit_figures=sink.figures,
    )
    return handle
