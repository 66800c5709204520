"""What every sink shares: the `SinkHandle` a pipeline's `build(ctx)` returns and the runner
drives, the `SinkFencedError` a replaced attempt's batch fails with, and flat rows for tables
and files. The package docstring says how fencing and ownership work; this module holds no
connector, so every connector can build on it without importing the package back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ContextManager, Protocol

from shared.errors import TaskError

from .ownership import SinkOwner

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery


class SinkFencedError(TaskError, RuntimeError):
    """A batch of an attempt that is no longer the one holding the sink: a newer attempt of the
    same task took it over (prepare). Raised inside the batch's commit, which writes nothing, so
    the stale attempt's query fails; the JobManager ignores failures of attempts it replaced."""

    def __init__(self, sink: str, attempt: int, newer: int | None):
        self.sink, self.attempt, self.newer = sink, attempt, newer
        holder = f"attempt {newer}" if newer is not None else "no attempt (its fence record is gone)"
        super().__init__(
            f"sink {sink}: attempt {attempt} is fenced off, the sink is held by {holder}; "
            f"this attempt was replaced and may not write any more batches (it is a stale "
            f"'zombie' attempt: stop it; the newer attempt carries on)"
        )

    def __reduce__(self):  # picklable despite its own signature (e.g. across processes)
        return (SinkFencedError, (self.sink, self.attempt, self.newer))


class TwoPhaseSink(Protocol):
    """A sink that writes each batch into an open transaction and commits at checkpoints."""

    def hold(self) -> ContextManager[int | None]:
        """Keep batches out of the transaction meanwhile; yields the last batch that went through
        the sink (None: none yet in this attempt)."""

    def pending_beyond(self, committed: int | None) -> bool:
        """Whether the transaction holds a batch Spark has not committed."""

    def commit(self, batch_id: int, *, checkpoint_id: int, path: str, kind: str) -> None:
        """Make the batches up to `batch_id` visible, atomically with the checkpoint's marker."""

    def close(self, *, abort: bool) -> None:
        """Release the sink; `abort`: end an open transaction now."""


class SinkAheadOfRestore(TaskError, RuntimeError):
    """A two-phase sink committed a checkpoint newer than the one this attempt restored (its
    acknowledgement never reached the JobManager): restore `path` (batch `batch_id`) instead
    (runtime/restore.py), or nothing would stop the newer batches from being written twice."""

    def __init__(self, path: str, batch_id: int, restored_batch_id: int):
        self.path, self.batch_id, self.restored_batch_id = path, batch_id, restored_batch_id
        super().__init__(
            f"the sink committed the checkpoint at batch {batch_id} ({path}) after the one "
            f"restored at batch {restored_batch_id}"
        )


@dataclass
class SinkHandle:
    """What `build(ctx)` returns.

    `name` names the checkpoint subdirectory, so it must stay stable across attempts of a job.
    Streaming: `configure(writer)` adds the sink's format/options to a `DataStreamWriter` whose
    output mode, trigger and checkpoint the handle applies. Batch: `run_batch()` does the write.
    `on_prepare(attempt, restored_batch_id, owner)` checks ownership, fences and rewinds the sink
    (see the module docstring); sinks without external state (console) leave it None.
    """

    name: str
    df: "DataFrame"
    output_mode: str = "append"
    trigger: str | None = None
    configure: Callable[["DataStreamWriter"], "DataStreamWriter"] | None = None
    run_batch: Callable[[], None] | None = None
    options: dict[str, str] = field(default_factory=dict)
    on_prepare: Callable[[int, int, SinkOwner | None], None] | None = None
    # The part of on_prepare that needs no restored batch (a sink whose fencing is several
    # network round trips: Kafka's): run beside the snapshot's restore (runtime/restore.py).
    on_early_fence: Callable[[int, SinkOwner | None], None] | None = None
    # A sink whose batches become visible only at checkpoints (Kafka's exactly-once sink): the
    # snapshot server commits it at each barrier (runtime/snapshots.py, TwoPhaseSink).
    two_phase: "TwoPhaseSink | None" = None
    # Spark's real-time mode (Kafka source, Kafka or foreach sink, stateless): the sinks that take
    # it say so; `real_time` is the trigger's batch length the job asked for (the runner sets it).
    supports_real_time: bool = False
    real_time: str | None = None
    # A sink that records something in every snapshot (a Delta sink: the table version of the
    # snapshot's batch): `on_snapshot(batch, kind, target)` is kept under "sink" in the snapshot's
    # _metadata (runtime/snapshots.py), and `restored_sink` is that entry of the snapshot an
    # attempt restores, set before prepare (runtime/restore.py).
    on_snapshot: Callable[[int | None, str, str], dict] | None = None
    restored_sink: dict | None = None
    # What the sink committed for a batch, reported with its progress (Progress.sink_commit).
    commit_figures: Callable[[int], dict[str, int] | None] | None = None
    attempt: int | None = None  # set by prepare()

    @property
    def streaming(self) -> bool:
        return self.df.isStreaming

    def prepare(self, attempt: int, restored_batch_id: int, owner: SinkOwner | None = None) -> None:
        """Take the sink over for `attempt`, which starts from Spark batch `restored_batch_id`
        (-1 = fresh start). Call once on the driver before `start`. Raises `SinkFencedError`
        when a newer attempt already holds the sink, `SinkOwnedError` when `owner`'s lineage
        does not own it (without `owner`, as tools call it, ownership is neither checked nor
        recorded)."""
        if attempt < 0:
            raise ValueError(f"sink {self.name}: attempt must be >= 0, got {attempt}")
        if restored_batch_id < -1:
            raise ValueError(
                f"sink {self.name}: restored_batch_id must be >= -1 (-1 = fresh start), got {restored_batch_id}"
            )
        self.attempt = attempt
        if self.on_prepare is not None:
            self.on_prepare(attempt, restored_batch_id, owner)

    def start(
        self,
        checkpoint_location: str,
        query_name: str | None = None,
        *,
        available_now: bool = False,
        once: bool = False,
    ) -> "StreamingQuery":
        """`available_now`: process what the sources hold now, then stop at a committed batch
        (the runner drains a query so before a final savepoint). `once`: one micro-batch, the
        planned one if Spark had not committed it (a stop cut it off), then stop."""
        if self.configure is None:
            raise TypeError(f"sink {self.name} does not support streaming DataFrames")
        writer = self.df.writeStream.outputMode("update" if self.real_time else self.output_mode)
        writer = writer.option("checkpointLocation", checkpoint_location)
        if query_name:
            writer = writer.queryName(query_name)
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif self.real_time and not once:
            writer = writer.trigger(realTime=self.real_time)  # type: ignore[call-overload]  # stubs predate it
        elif once:
            writer = writer.trigger(once=True)
        elif self.trigger:
            writer = writer.trigger(processingTime=self.trigger)
        return self.configure(writer).start()

    def run(self) -> None:
        if self.run_batch is None:
            raise TypeError(f"sink {self.name} does not support batch DataFrames")
        self.run_batch()


def flatten_structs(df: "DataFrame") -> "DataFrame":
    """Struct columns become `<col>_<field>` columns (a window becomes window_start/window_end):
    tables and files want flat rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    cols = []
    for f in df.schema.fields:
        if isinstance(f.dataType, StructType):
            cols += [F.col(f"`{f.name}`.`{s.name}`").alias(f"{f.name}_{s.name}") for s in f.dataType.fields]
        else:
            cols.append(F.col(f"`{f.name}`"))
    return df.select(*cols)
