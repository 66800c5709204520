"""Which lineage writes a Delta table, recorded in the table itself.

Each lineage that writes a table keeps one record among the table's properties,
`headrace.writer.<app id>` (JSON: lineage, job, generation, fence token, seq, the version it first
claimed the table at, shared or not, the jobs it replaced), changed only by an ALTER TABLE ... SET
TBLPROPERTIES commit. That commit is the claim: two attempts claiming at once both change the
table's metadata, so Delta lets one commit and refuses the other (MetadataChangedException), which
claims again and sees the winner. The record travels with the table (a copy or a move keeps it)
and any Delta reader shows it (`DESCRIBE DETAIL`, delta-rs `metadata().configuration`).

Rules, checked before anything is written or undone:
  * another lineage's record refuses the claim with SinkOwnedError naming it, unless both the
    claimant and every other writer opted into shared append (`shared_append=True`);
  * within the lineage, a job replaced by a newer job of it is refused (ownership.check_claim),
    and an attempt whose fence token is older than the record's is fenced (SinkFencedError);
  * a table without any record (made by hand, or by another tool) may be claimed: the sink only
    ever undoes its own commits, so what others wrote before stays.
The seq of the new record is above both the old record's and the seq of the transaction version
Delta holds for the app (a RESTORE puts the properties back, never the transaction versions).

What this does not stop: pipeline code that writes the path directly with Spark (every pipeline
runs as the same OS user). The record guards against two jobs pointed at one table by mistake.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import delta_log
from .ownership import SinkOwnedError, SinkOwner, check_claim, describe, replaced_after
from .sinks import SinkFencedError

PREFIX = "headrace.writer."
CLAIM_TRIES = 8  # concurrent claims each lose at most once per winner


@dataclass
class WriterRecord:
    lineage: str
    job_id: str
    generation: int = 0
    fence: int = 0
    seq: int = 0
    since: int = -1  # the table version when the lineage first claimed it
    shared: bool = False
    replaced: list[str] = field(default_factory=list)

    def owner(self) -> SinkOwner:
        return SinkOwner(lineage=self.lineage, job_id=self.job_id, generation=self.generation)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "WriterRecord":
        rec = json.loads(text)
        return cls(**{k: rec[k] for k in cls.__dataclass_fields__ if k in rec})


def records(properties: dict[str, str]) -> dict[str, WriterRecord]:
    """app id -> record, of every Headrace writer the table's properties name."""
    out = {}
    for key, value in properties.items():
        if key.startswith(PREFIX):
            try:
                out[key[len(PREFIX) :]] = WriterRecord.from_json(value)
            except (ValueError, TypeError):
                continue  # not ours to read: a hand-made property of that name
    return out


def release_hint(path: str, app_id: str) -> str:
    return (
        f"cancel the owner's job, then `ALTER TABLE {delta_log.quoted(path)} UNSET TBLPROPERTIES "
        f"('{PREFIX}{app_id}')` (the table and its rows stay; only the claim goes), or write to another table"
    )


def is_conflict(exc: BaseException) -> bool:
    """A commit Delta refused because another one won the race (its optimistic concurrency)."""
    text = f"{type(exc).__name__}: {exc}"
    return any(
        name in text
        for name in (
            "MetadataChangedException",
            "ConcurrentAppendException",
            "ConcurrentTransactionException",
            "ProtocolChangedException",
            "ConcurrentDeleteReadException",
            "ConcurrentDeleteDeleteException",
            "DELTA_METADATA_CHANGED",
            "DELTA_CONCURRENT_",
            "FileAlreadyExistsException",
        )
    )


def new_record(
    path: str,
    app_id: str,
    state: delta_log.TableState,
    *,
    fence: int,
    owner: SinkOwner | None,
    shared: bool,
    restored_batch_id: int,
    sink_name: str,
) -> WriterRecord:
    """The record this attempt writes; SinkOwnedError / SinkFencedError when it may not."""
    recs = records(state.properties)
    own = recs.pop(app_id, None)
    if owner is not None:
        for other_app, rec in recs.items():
            if rec.lineage == owner.lineage:
                continue
            if not (shared and rec.shared):
                raise SinkOwnedError(
                    "Delta table", path, rec.lineage, rec.job_id, describe(owner), release_hint(path, other_app)
                )
        if own is not None:
            check_claim(
                "Delta table",
                path,
                owner,
                own.owner(),
                restored_batch_id=restored_batch_id,
                has_commits=True,
                release=release_hint(path, app_id),
                replaced=own.replaced,
            )
    if own is not None and own.fence > fence:
        raise SinkFencedError(sink_name, fence, own.fence)
    seq = max(own.seq if own else 0, delta_log.seq_of(state.txn)) + 1
    base = owner or (own.owner() if own else SinkOwner(lineage=app_id, job_id=app_id))
    return WriterRecord(
        lineage=base.lineage,
        job_id=base.job_id,
        generation=base.generation,
        fence=fence,
        seq=seq,
        since=own.since if own else state.version,
        shared=shared,
        replaced=replaced_after(base, own.owner() if own else None, own.replaced if own else []),
    )


def write_record(spark: Any, path: str, app_id: str, record: WriterRecord, what: str) -> None:
    """One ALTER TABLE commit; raises what Delta raises (is_conflict: another claim won)."""
    with delta_log.tagged(spark, delta_log.tag(app_id, what)):
        spark.sql(
            f"ALTER TABLE {delta_log.quoted(path)} SET TBLPROPERTIES "
            f"({delta_log.sql_string(PREFIX + app_id)} = {delta_log.sql_string(record.to_json())})"
        )


def claim(
    spark: Any,
    path: str,
    app_id: str,
    *,
    fence: int,
    owner: SinkOwner | None,
    shared: bool,
    restored_batch_id: int,
    sink_name: str,
) -> WriterRecord:
    """Check and write this attempt's record, again while another claim wins the race."""
    for attempt in range(CLAIM_TRIES):
        state = delta_log.table_state(spark, path, app_id)
        record = new_record(
            path,
            app_id,
            state,
            fence=fence,
            owner=owner,
            shared=shared,
            restored_batch_id=restored_batch_id,
            sink_name=sink_name,
        )
        try:
            write_record(spark, path, app_id, record, f"claim seq {record.seq}")
            return record
        except Exception as exc:
            if not is_conflict(exc) or attempt == CLAIM_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")
