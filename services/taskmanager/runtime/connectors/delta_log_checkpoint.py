"""Checkpoints of a Delta table's log, written by the sink through delta-rs after a commit rather
than by Delta inside one.

A reader of a Delta table (delta-rs, Delta's streaming source, `ctx.sources.delta`) starts from
the newest checkpoint of the log (the table's whole state as one Parquet file) and replays the
JSON commits after it. Delta writes that checkpoint itself, in a post-commit hook that runs
before the commit returns, whenever the committed version is a multiple of the table property
`delta.checkpointInterval` (10 by default; delta-io/delta 4.4, `CheckpointHook` and
`isCheckpointNeeded`). Delta builds it with Spark jobs that rebuild the table's state: on a
2-core driver that made every tenth micro-batch about 0.8 s longer, and the events waiting
behind it were the latency's tail (docs/benchmarks.md, "Latency to a visible row").

delta-rs (the `deltalake` package, already the independent reader of the tests) writes the same
checkpoint from the log in Rust, in milliseconds, in the driver's own process. So a table the sink
creates is created with `delta.checkpointInterval` = NO_INLINE_CHECKPOINT (a version no commit
reaches; the property is part of the creating commit, so there is no metadata commit of its own),
and after a commit that leaves the newest checkpoint `every` versions or more behind (sink option
`logCheckpoint.every`, job option `sink.delta.logCheckpoint.every`, default 10: Delta's own
cadence) the sink checkpoints the newest version with delta-rs before the next micro-batch.
`every` = 0 leaves the checkpoints to Delta.

delta-rs writes only for tables whose protocol it is known to copy faithfully (FAITHFUL_*): no
reader features, and writer features that change no file action. Any other table, or a delta-rs
that fails, gets Delta's own `DeltaLog.checkpoint` instead, in line as Delta's hook would have.

The rule the sink follows on any table: where the table's own interval is longer than `every`,
the sink writes a checkpoint every `every` commits; otherwise Delta's hook already does. So a
table the sink did not create keeps Delta's checkpoints inside its commits until an operator
raises its interval (docs/runbooks/delta.md, "Every tenth batch slow"). Other writers of a table
with the long interval write no checkpoints: while no Headrace sink writes it, readers replay the
JSON commits since the last one.

Delta's hook also deletes log files older than `delta.logRetentionDuration` (30 days) once a
checkpoint covers them; the sink does the same through delta-rs unless
`delta.enableExpiredLogCleanup` is false. A failed checkpoint is logged and tried again after the
next commit; it never fails a batch (a checkpoint changes no row).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Mapping

from . import delta_log
from .delta_errors import RUNBOOK

INTERVAL_PROPERTY = "delta.checkpointInterval"
LOG_CLEANUP_PROPERTY = "delta.enableExpiredLogCleanup"
DELTA_DEFAULT_INTERVAL = 10
# Delta reads the interval as a 32-bit int > 0 and checkpoints versions that are multiples of it:
# the largest one is never reached by a streaming table's commits.
NO_INLINE_CHECKPOINT = 2**31 - 1
DEFAULT_EVERY = DELTA_DEFAULT_INTERVAL
# Protocols whose checkpoint is the log's file actions plus metadata, protocol and transactions
# copied as they are: writer versions up to 4 (append-only, invariants, check constraints, change
# data feed, generated columns) or their table features; no reader features (deletion vectors,
# column mapping, v2 checkpoints change what a checkpoint must hold).
FAITHFUL_READER_VERSION = 1
FAITHFUL_WRITER_VERSION = 4
FAITHFUL_WRITER_FEATURES = frozenset(
    {"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"}
)


def table_interval(properties: Mapping[str, str]) -> int:
    """The table's `delta.checkpointInterval` (Delta's default where unset or unreadable)."""
    try:
        value = int(properties.get(INTERVAL_PROPERTY, DELTA_DEFAULT_INTERVAL))
    except ValueError:
        return DELTA_DEFAULT_INTERVAL
    return value if value > 0 else DELTA_DEFAULT_INTERVAL


def creation_properties(every: int) -> dict[str, str]:
    """The table properties a sink that checkpoints every `every` commits creates its table with."""
    return {INTERVAL_PROPERTY: str(NO_INLINE_CHECKPOINT)} if every > 0 else {}


def faithful(reader_version: int, writer_version: int, writer_features: Any, reader_features: Any) -> bool:
    """Whether delta-rs's checkpoint of a table with this protocol holds what Delta's would."""
    if reader_version > FAITHFUL_READER_VERSION or reader_features:
        return False
    if writer_features:
        return set(writer_features) <= FAITHFUL_WRITER_FEATURES
    return writer_version <= FAITHFUL_WRITER_VERSION


def write_with_delta_rs(path: str) -> tuple[int, str] | None:
    """Checkpoint the table's newest version with delta-rs, and delete expired log files as Delta's
    hook would; (version, "delta-rs"), or None where its protocol is not one delta-rs copies
    faithfully."""
    from deltalake import DeltaTable

    table = DeltaTable(path)
    p = table.protocol()
    if not faithful(p.min_reader_version, p.min_writer_version, p.writer_features, p.reader_features):
        return None
    table.create_checkpoint()
    if table.metadata().configuration.get(LOG_CLEANUP_PROPERTY, "true").lower() != "false":
        table.cleanup_metadata()
    return table.version(), "delta-rs"


class LogCheckpoints:
    """The log checkpoints one sink writes for its table (module docstring)."""

    def __init__(self, path: str, every: int = DEFAULT_EVERY):
        if every < 0:
            raise ValueError(f"logCheckpoint.every must be a whole number of commits (0: Delta's own), got {every}")
        self.path, self.every = path, every
        self.written: list[tuple[int, float, str]] = []  # (version, seconds, by whom), the newest last
        self._last: int | None = None  # the newest checkpoint's version, read from the log at first

    def wanted(self, properties: Mapping[str, str]) -> bool:
        """Whether the sink checkpoints a table with these properties (else Delta does)."""
        return self.every > 0 and table_interval(properties) > self.every

    def describe(self, properties: Mapping[str, str]) -> str:
        """Who checkpoints the table's log, for the driver's log."""
        if self.wanted(properties):
            return f"the sink checkpoints the log of {self.path} every {self.every} commits, after the commit"
        interval = table_interval(properties)
        if interval >= NO_INLINE_CHECKPOINT:
            return (
                f"no writer checkpoints the log of {self.path} "
                f"(logCheckpoint.every is 0 and {INTERVAL_PROPERTY} is {interval})"
            )
        return (
            f"Delta checkpoints the log of {self.path} inside every {interval}th commit ({INTERVAL_PROPERTY}); "
            f'{RUNBOOK}, "Every tenth batch slow", says how to hand them to the sink'
        )

    def due(self, version: int) -> bool:
        if self._last is None:
            self._last = delta_log.last_checkpoint(self.path)
        return version >= self._last + self.every

    def committed(self, spark: Any, version: int, properties: Mapping[str, str]) -> None:
        """After a commit of `version`: checkpoint the log now when one is due."""
        if not self.wanted(properties) or not self.due(version):
            return
        started = time.monotonic()
        try:
            written, by = self._with_delta_rs() or (delta_log.checkpoint(spark, self.path), "Delta")
        except Exception as exc:  # noqa: BLE001 - a checkpoint changes no row; the next commit tries again
            print(
                f"delta: checkpoint of the log of {self.path} failed after {time.monotonic() - started:.1f} s, "
                f"tried again after the next commit: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}",
                file=sys.stderr,
                flush=True,
            )
            return
        self._last = max(self._last or 0, written)
        self.written.append((written, time.monotonic() - started, by))
        del self.written[:-100]

    def _with_delta_rs(self) -> tuple[int, str] | None:
        try:
            return write_with_delta_rs(self.path)
        except Exception as exc:  # noqa: BLE001 - Delta's own checkpoint is the way back
            print(
                f"delta: delta-rs could not checkpoint the log of {self.path}, Delta's own checkpoint instead: "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}",
                file=sys.stderr,
                flush=True,
            )
            return None
