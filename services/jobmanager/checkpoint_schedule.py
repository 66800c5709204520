"""When the checkpoint coordinator triggers: one `Track` per job whose attempt runs, with its
options, when its next periodic checkpoint is due and the trigger times of its pending ones.

In memory only: a new leader rebuilds it from the catalog (CheckpointCoordinator.recover), and
everything else about a checkpoint is in the catalog. Times are the coordinator's clock
(monotonic), never written anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared import checkpointing
from shared.ids import ExecutionId, JobId, TaskManagerId, VertexId


@dataclass
class Track:
    """One job's running attempt, as far as checkpointing is concerned."""

    execution_id: ExecutionId
    vertex_id: VertexId
    taskmanager_id: TaskManagerId
    config: checkpointing.CheckpointConfig
    next_due: float
    last_completed: float = float("-inf")
    pending: dict[int, float] = field(default_factory=dict)  # checkpoint id -> trigger time (monotonic)
    checkpointable: bool = True


class TriggerSchedule:
    def __init__(self) -> None:
        self._tracks: dict[JobId, Track] = {}

    def __bool__(self) -> bool:
        return bool(self._tracks)

    def jobs(self) -> list[JobId]:
        return list(self._tracks)

    def tracks(self, job_id: JobId, execution_id: ExecutionId | None) -> bool:
        """Is that very attempt the job's tracked one?"""
        track = self._tracks.get(job_id)
        return track is not None and track.execution_id == execution_id

    def track(self, job_id: JobId, track: Track) -> None:
        self._tracks[job_id] = track

    def forget(self, job_id: JobId, execution_id: ExecutionId | None = None) -> None:
        """Stop tracking the job; with `execution_id`, only if that attempt is the tracked one."""
        if execution_id is None or self.tracks(job_id, execution_id):
            self._tracks.pop(job_id, None)

    def clear(self) -> None:
        self._tracks.clear()

    # --- pending checkpoints -----------------------------------------------------------

    def triggered(self, job_id: JobId, checkpoint_id: int, at: float) -> None:
        self._tracks[job_id].pending[checkpoint_id] = at

    def adopt(self, job_id: JobId, execution_id: ExecutionId | None, checkpoint_id: int, triggered_at: float) -> bool:
        """Take a predecessor's pending checkpoint of the tracked attempt; False if the attempt
        it was triggered for is not the tracked one."""
        if not self.tracks(job_id, execution_id):
            return False
        self._tracks[job_id].pending[checkpoint_id] = triggered_at
        return True

    def settled(self, job_id: JobId, checkpoint_id: int) -> None:
        """The checkpoint failed or expired: no longer pending."""
        track = self._tracks.get(job_id)
        if track is not None:
            track.pending.pop(checkpoint_id, None)

    def completed(self, job_id: JobId, checkpoint_id: int, at: float) -> None:
        """The checkpoint completed: no longer pending, and `min-pause` counts from now."""
        track = self._tracks.get(job_id)
        if track is not None:
            track.pending.pop(checkpoint_id, None)
            track.last_completed = at

    def never_checkpointable(self, job_id: JobId) -> None:
        """The task declined for good (a batch query): no periodic trigger any more."""
        track = self._tracks.get(job_id)
        if track is not None:
            track.checkpointable = False

    def still_pending(self, job_id: JobId, checkpoint_id: int, execution_id: ExecutionId) -> bool:
        return self.tracks(job_id, execution_id) and checkpoint_id in self._tracks[job_id].pending

    # --- what is due -------------------------------------------------------------------

    def timed_out(self, job_id: JobId, now: float) -> list[int]:
        """The job's pending checkpoints older than its checkpoint timeout."""
        track = self._tracks.get(job_id)
        if track is None:
            return []
        return [cid for cid, started in track.pending.items() if now - started > track.config.timeout_s]

    def take_due(self, job_id: JobId, now: float) -> ExecutionId | None:
        """The attempt whose periodic checkpoint is due now, its next one set an interval later;
        None when the job is not periodic (interval_s None), cannot checkpoint, has
        `max-concurrent` pending, is not due yet, or is within `min-pause` of its last completion."""
        track = self._tracks.get(job_id)
        if track is None or track.config.interval_s is None or not track.checkpointable:
            return None
        if len(track.pending) >= track.config.max_concurrent or now < track.next_due:
            return None
        if now - track.last_completed < track.config.min_pause_s:
            return None
        track.next_due = now + track.config.interval_s
        return track.execution_id
