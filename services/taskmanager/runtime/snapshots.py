"""Checkpoints of a streaming task (a `snapshot` line on stdin, see shared/task_protocol.py).

The barrier is a micro-batch commit. A request remembers the batch Spark had planned when it
arrived and is served at the first commit at or after it, by copying the live Spark checkpoint
at that batch into the target directory (shared/checkpoint_storage.py); `stop_after` stops the
query first and snapshots its last committed batch (stop-with-savepoint), `drain` first lets
every open window fire.

A two-phase sink (the exactly-once Kafka sink: connectors/sinks.py TwoPhaseSink) makes its
batches visible only at a snapshot. At the barrier the server holds the sink (no batch enters
its transaction), takes the snapshot at the last batch the sink wrote once Spark has committed
it, commits the sink with the snapshot's marker, and only then acknowledges: a checkpoint the
JobManager completes is always one the sink committed. A stop that cut a batch off after the
sink wrote it runs that batch to its commit first (a query started with `once`), so the
savepoint and the sink agree."""

from __future__ import annotations

import queue
import sys
import time
from pathlib import Path
from typing import Any

from shared import checkpoint_storage as storage
from shared.task_protocol import SnapshotDeclined, SnapshotTaken, TakeSnapshot, TaskSpec, snapshot_metadata

from .driver_io import EventWriter
from .query_slot import QuerySlot

DRAIN_TIMEOUT_S = 300.0
# Where a bounded query's end is snapshotted for a two-phase sink (beside the live checkpoint),
# under an id no checkpoint of the JobManager's has.
FINAL_SNAPSHOT = "final"
FINAL_CHECKPOINT_ID = -1
# How long a barrier waits for Spark to commit the batch a two-phase sink last wrote.
SINK_SETTLE_TIMEOUT_S = 60.0

Pending = tuple[TakeSnapshot, "int | None", float]  # request, barrier batch, when it came


class SnapshotServer:
    """Serves the snapshot requests of one streaming task."""

    def __init__(
        self, events: EventWriter, queries: QuerySlot, spec: TaskSpec, handle: Any, live: Path, lineage: dict
    ) -> None:
        self.events = events
        self.queries = queries
        self.spec = spec
        self.handle = handle
        self.live = live
        self.lineage = lineage
        self.pending: list[Pending] = []
        # A new JobManager leader sends the triggers it inherited again (it cannot know whether
        # they went out): each checkpoint id is served once.
        self._requested: set[int] = set()
        # Read at the first snapshot, not at start: the analysis took 0.12-0.17 s on the path to
        # the task's first result (docs/benchmarks.md, "Submission to first result").
        self._plan_of: tuple[Any, str] | None = (handle.df, handle.output_mode)
        self._plan: dict | None = None

    def take_requests(self, requests: queue.Queue[TakeSnapshot]) -> None:
        while not requests.empty():
            req = requests.get_nowait()
            if req.checkpoint_id in self._requested:
                continue
            self._requested.add(req.checkpoint_id)
            self.pending.append((req, storage.latest_planned_batch(self.live), time.monotonic()))

    def serve(self, query: Any) -> tuple[Any, bool]:
        """Take every requested snapshot whose barrier batch has committed. Returns the query
        (restarted if a stop-with-savepoint failed after stopping it) and whether the task
        stopped for good."""
        spec, live = self.spec, self.live
        for item in list(self.pending):
            req, planned, received = item
            if req.stop_after:
                self.pending.remove(item)
                self.queries.stop(query)
                try:
                    if req.drain:
                        self._drain()
                    self._complete_cut_off_batch()
                except Exception as exc:  # noqa: BLE001 - reported; the query resumes below
                    self.events.emit(
                        SnapshotDeclined(
                            checkpoint_id=req.checkpoint_id, reason=f"draining failed: {type(exc).__name__}: {exc}"
                        )
                    )
                    query = self.queries.start(self.handle, live, spec.job_id)
                    continue
                if self._snapshot(req, storage.latest_committed_batch(live), received):
                    return query, True
                # As in Flink, a failed stop-with-savepoint leaves the job running: resume the
                # query from its own live checkpoint, which nobody else has touched.
                query = self.queries.start(self.handle, live, spec.job_id)
                continue
            committed = storage.latest_committed_batch(live)
            if planned is None or (committed is not None and committed >= planned):
                self.pending.remove(item)
                self._snapshot(req, committed if planned is not None else None, received)
        return query, False

    def _complete_cut_off_batch(self) -> None:
        """After a stop: a batch the two-phase sink wrote but Spark did not commit is run to its
        commit (Spark re-runs the planned batch; the sink skips the rows it has), so the snapshot
        and the sink's transaction end at the same batch."""
        sink = self.handle.two_phase
        if sink is None or not sink.pending_beyond(storage.latest_committed_batch(self.live)):
            return
        q = self.queries.start(self.handle, self.live, self.spec.job_id, once=True)
        if not q.awaitTermination(DRAIN_TIMEOUT_S):
            q.stop()
            raise TimeoutError(f"the micro-batch a stop cut off did not commit within {DRAIN_TIMEOUT_S:.0f} s")
        if q.exception() is not None:
            raise q.exception()

    def _drain(self) -> None:
        """Before a drained stop (the query is stopped): process everything the sources hold now,
        then run one logged no-data batch whose watermark is the end of event time, so every
        window still open fires into the sink, as Flink's drain does with MAX_WATERMARK. A job
        resumed from such a savepoint treats all new events as late: drain is for the end of a
        pipeline's life, not for upgrades."""
        for end_event_time in (False, True):
            if end_event_time:
                if storage.latest_committed_batch(self.live) is None:
                    return  # nothing ever ran: no window is open
                storage.log_final_watermark_batch(self.live)
            q = self.queries.start(self.handle, self.live, self.spec.job_id, available_now=True)
            if not q.awaitTermination(DRAIN_TIMEOUT_S):
                q.stop()
                raise TimeoutError(f"draining did not finish within {DRAIN_TIMEOUT_S:.0f} s")
            if q.exception() is not None:
                raise q.exception()

    def _plan_signature(self) -> dict | None:
        """The streaming query's plan signature (plan_signature.py), worked out once."""
        if self._plan_of is not None:
            df, output_mode = self._plan_of
            self._plan_of = None
            try:
                from .plan_signature import plan_signature

                self._plan = plan_signature(df, output_mode=output_mode)
            except Exception as exc:  # noqa: BLE001 - the signature only enriches snapshot metadata
                print(f"plan signature unavailable: {exc!r}", file=sys.stderr, flush=True)
        return self._plan

    def _snapshot(self, req: TakeSnapshot, batch: int | None, received: float) -> bool:
        sink = self.handle.two_phase
        if sink is None:
            return self._take(req, batch, received)
        with sink.hold() as last_written:
            if last_written is not None:
                batch = self._settled(last_written)
            return self._take(req, batch, received)

    def _settled(self, batch: int) -> int:
        """The committed batch once Spark has committed `batch` (the sink's last), bounded."""
        deadline = time.monotonic() + SINK_SETTLE_TIMEOUT_S
        while True:
            committed = storage.latest_committed_batch(self.live)
            if committed is not None and committed >= batch:
                return committed
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Spark did not commit micro-batch {batch}, which the sink wrote, within "
                    f"{SINK_SETTLE_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.02)

    def _metadata(self, kind: str, checkpoint_id: int) -> dict:
        meta = snapshot_metadata(self.spec, kind=kind, checkpoint_id=checkpoint_id)
        meta["pipeline"]["plan"] = self._plan_signature()
        meta["query_name"] = self.handle.name
        meta["lineage"] = {"id": self.lineage["id"], "generation": self.lineage["generation"]}
        return meta

    def _take(self, req: TakeSnapshot, batch: int | None, received: float) -> bool:
        meta = self._metadata(req.kind, req.checkpoint_id)
        try:
            if self.handle.on_snapshot is not None:  # e.g. the Delta table version at this batch
                meta["sink"] = self.handle.on_snapshot(batch, req.kind, req.target)
            if batch is None:  # no batch ever planned: the state is the empty start
                info = storage.take_empty_snapshot(Path(req.target), metadata=meta)
            else:
                info = storage.take_snapshot(self.live, Path(req.target), batch_id=batch, metadata=meta)
        except Exception as exc:  # noqa: BLE001 - every failure is a decline with its reason
            self.events.emit(SnapshotDeclined(checkpoint_id=req.checkpoint_id, reason=f"{type(exc).__name__}: {exc}"))
            return False
        if self.handle.two_phase is not None and info.batch_id is not None:
            # Outside the decline above: a sink that cannot commit fails the task, whose restart
            # replays from the last checkpoint (its transaction is aborted by then).
            self.handle.two_phase.commit(
                info.batch_id, checkpoint_id=req.checkpoint_id, path=str(info.path), kind=req.kind
            )
        self.events.emit(
            SnapshotTaken(
                checkpoint_id=req.checkpoint_id,
                path=str(info.path),
                batch_id=info.batch_id,
                state_size=info.state_size,
                duration_ms=int((time.monotonic() - received) * 1000),
                source_offsets=tuple(info.source_offsets),
            )
        )
        return True

    def commit_final(self) -> None:
        """A query that ended with its input (bounded sources): a two-phase sink's last batches
        become visible now, with a snapshot of the end in the attempt's own directory (so that an
        attempt started again, if the end was never reported, restores it and writes nothing twice)."""
        sink = self.handle.two_phase
        if sink is None:
            return
        with sink.hold() as last_written:
            if last_written is None:
                return
            batch = self._settled(last_written)
            target = self.live.parent / FINAL_SNAPSHOT
            try:
                info = storage.take_snapshot(
                    self.live, target, batch_id=batch, metadata=self._metadata("final", FINAL_CHECKPOINT_ID)
                )
                path = str(info.path)
            except Exception as exc:  # noqa: BLE001 - the commit matters more than the snapshot
                print(
                    f"final snapshot not taken ({type(exc).__name__}: {exc}); committing the sink without one",
                    file=sys.stderr,
                    flush=True,
                )
                path = ""
            sink.commit(batch, checkpoint_id=FINAL_CHECKPOINT_ID, path=path, kind="final")


def decline_forever(events: EventWriter, requests: queue.Queue[TakeSnapshot]) -> None:
    """A batch task's answer to every snapshot request."""
    while True:
        req = requests.get()
        events.emit(
            SnapshotDeclined(checkpoint_id=req.checkpoint_id, permanent=True, reason="a batch task has no checkpoints")
        )
