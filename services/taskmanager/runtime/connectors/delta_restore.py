"""Undoing a lineage's commits after a restore point: a restore of a Delta sink.

A snapshot records the table version the sink had committed at its batch (`version` in the
snapshot's "sink" metadata). An attempt restored from it re-runs the batches after it, so the
table must first be as if they had never run: a rollback from a broken version must not keep
that version's rows, and a replay with other batch boundaries must not add rows twice. Delta's
transaction versions cannot do this alone: a RESTORE does not take them back, so the replayed
batches would be skipped as already written (delta_log.py).

The undo, after the attempt's claim and fence commit (so no older attempt can commit meanwhile):
  1. read every commit after the restore point t. Commits of this sink (its transaction app, or
     its tag in the commit's userMetadata) may be undone; another writer's commits that change
     no data (OPTIMIZE, VACUUM, property changes) do not matter;
  2. if this sink has no data commit after t, nothing is done;
  3. another writer's data commit after t refuses the undo (DeltaUndoRefused): restoring would
     remove its rows too;
  4. RESTORE TABLE ... TO VERSION AS OF t, tagged with what it undoes (DESCRIBE HISTORY shows
     it). Delta refuses a version whose files VACUUM deleted or whose log entries are gone: that
     is a DeltaUndoRefused too, naming the settings that decide it.
Nothing is changed when the undo is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import delta_log
from .delta_errors import RUNBOOK, DeltaUndoRefused


@dataclass(frozen=True)
class Undone:
    """What an undo removed."""

    to_version: int  # the table is as it was then
    versions: tuple[int, ...]  # this sink's commits undone
    batches: tuple[int, ...]
    rows: int
    new_version: int  # the RESTORE commit

    def describe(self, path: str) -> str:
        span = f"batches {self.batches[0]}..{self.batches[-1]}" if self.batches else "no batch (bookkeeping only)"
        return (
            f"undid {span} of this lineage in the Delta table {path}: versions "
            f"{self.versions[0]}..{self.versions[-1]} ({self.rows} rows added), restored to version "
            f"{self.to_version} as version {self.new_version}; the batches after the restore point are "
            f"written again"
        )


def version_at_batch(path: str, app_id: str, batch_id: int, since: int, latest: int) -> int:
    """Without a recorded version (a snapshot taken before the sink existed): the newest commit of
    this app at a batch <= `batch_id`, else `since`. Correct unless the batch was itself undone
    and written again, which is why snapshots record versions."""
    for v in range(latest, since, -1):
        c = delta_log.commit(path, v)
        if c is None:
            break
        mine = c.txns.get(app_id)
        if mine is not None and delta_log.batch_of(mine) <= batch_id:
            return v
    return max(since, -1)


def undo_after(spark: Any, path: str, app_id: str, to_version: int, latest: int) -> Undone | None:
    """Make the table as it was at `to_version` if only this sink changed its data since (module
    docstring); None when there was nothing to undo."""
    if to_version >= latest:
        return None
    if to_version < 0:
        raise DeltaUndoRefused(
            f"the Delta table {path} holds this lineage's rows from its very first version, "
            f"which a RESTORE cannot go back before; delete the table to start over "
            f'({RUNBOOK}, "A restore that cannot be undone")'
        )
    ours, foreign = [], []
    for v in range(to_version + 1, latest + 1):
        c = delta_log.commit(path, v)
        if c is None:
            raise _refused(
                path, to_version, f"its log no longer holds version {v} (log clean-up, delta.logRetentionDuration)"
            )
        if c.by(app_id):
            if c.data_change:
                ours.append(c)
        elif c.data_change:
            foreign.append(c)
    if not ours:
        return None
    if foreign:
        raise _refused(
            path,
            to_version,
            "another writer committed after it: "
            + "; ".join(c.describe() for c in foreign[:5])
            + ". Restoring would remove that writer's rows too",
        )
    batches = sorted({delta_log.batch_of(t) for c in ours for a, t in c.txns.items() if a == app_id} - {-1})
    what = (
        f"undo to version {to_version}, batches {batches[0]}..{batches[-1]}"
        if batches
        else f"undo to version {to_version}"
    )
    try:
        with delta_log.tagged(spark, delta_log.tag(app_id, what)):
            spark.sql(f"RESTORE TABLE {delta_log.quoted(path)} TO VERSION AS OF {to_version}").collect()
    except Exception as exc:
        text = str(exc)
        if (
            "Not all files from version" in text
            or "DELTA_CANNOT_RESTORE_TABLE_VERSION" in text
            or "VersionNotFound" in text
            or "DELTA_FILE_NOT_FOUND" in text
        ):
            reason = text.strip().splitlines()[0][:300]
            raise _refused(
                path,
                to_version,
                f"Delta cannot go back to it: {reason} (VACUUM deleted its files, or log clean-up its entries)",
            ) from None
        raise
    new = delta_log.table_state(spark, path, app_id).version
    return Undone(
        to_version=to_version,
        versions=tuple(c.version for c in ours),
        batches=tuple(batches),
        rows=sum(c.rows for c in ours),
        new_version=new,
    )


def _refused(path: str, version: int, why: str) -> DeltaUndoRefused:
    return DeltaUndoRefused(
        f"cannot restore the Delta table {path} to version {version}, where the restored snapshot left it: "
        f"{why}. Nothing was changed. Restore from a newer savepoint or checkpoint, or write the restored job "
        f'to a new table ({RUNBOOK}, "A restore that cannot be undone")'
    )
