"""Which lineage owns a sink target, and the refusal a foreign lineage gets.

A lineage is the chain of jobs that restore from each other's snapshots: a restart, a job
resumed from a savepoint or a retained checkpoint, a rollback to an older savepoint. Its id is
the id of its first job (shared/lineage.py). The fence token orders the attempts *within* one
lineage; it cannot tell two lineages apart, because the JobManager hands out growing tokens to
every job. A fence keyed by the target alone therefore let a fresh job (a new lineage, higher
token, restored batch -1) take a directory over and undo every batch of the job that wrote it,
and several fresh jobs on one directory took it from each other at every restart.

So every prepared target records its owner (lineage, the job that last prepared it, and that
job's generation in the lineage) next to its fence, and a prepare by another lineage is refused
with `SinkOwnedError` before anything is written or deleted. Within the owning lineage the fence
decides as before. A target's owner is released only by the operator removing the target (the
directory, or the sink's bookkeeping rows/keys): a job option that takes targets over would
travel with every resubmission and schedule of that job and undo another job's output each time,
which is exactly the loss this guards against.

Within the lineage, the jobs a newer job took the target from are *replaced*: a job resumed
from a savepoint of a job that still runs (or that restarts later) takes the target over, and
the older job's next attempt, although its fence token is newer, is refused too, instead of
taking the target back, rewinding the newer job's batches and starting the same tug-of-war
inside one lineage. The owner record keeps the last MAX_REPLACED replaced job ids. A rollback
(a new job from an older savepoint of the lineage) is a new job, so it may take the target.

Targets written before owners were recorded have a fence but no owner: a restore (restored
batch >= 0) adopts such a target, a fresh start into one that holds committed batches is
refused (it would undo them all), and an empty one is simply claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from shared.errors import TaskError

UNKNOWN = "unknown (written before Headrace recorded sink owners)"
MAX_REPLACED = 32  # replaced job ids an owner record keeps


@dataclass(frozen=True)
class SinkOwner:
    """The lineage an attempt writes for, and its job (`generation`: jobs before it in the
    lineage)."""

    lineage: str
    job_id: str
    generation: int = 0

    def __post_init__(self) -> None:
        if not self.lineage or not self.job_id:
            raise ValueError(f"a sink owner needs a lineage id and a job id, got {self!r}")

    def record(self) -> dict[str, Any]:
        return {"lineage": self.lineage, "job_id": self.job_id, "generation": self.generation}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> "SinkOwner":
        return cls(lineage=str(rec["lineage"]), job_id=str(rec["job_id"]), generation=int(rec.get("generation", 0)))


class SinkOwnedError(TaskError, RuntimeError):
    """A task (or batch write) found its sink target owned by another lineage. Raised before
    anything is written or deleted; restarting cannot help (the JobManager fails the job at
    once, services/jobmanager/transitions.py NON_RECOVERABLE)."""

    def __init__(
        self,
        kind: str,
        target: str,
        owner_lineage: str,
        owner_job: str,
        claimant: str,
        release: str,
        replaced: bool = False,
    ):
        self.kind, self.target, self.owner_lineage, self.owner_job = kind, target, owner_lineage, owner_job
        self.claimant, self.release, self.replaced = claimant, release, replaced
        if replaced:
            super().__init__(
                f"{kind} {target} is the sink of lineage {owner_lineage}, taken over by its newer job "
                f"{owner_job}; {claimant} was replaced by that job (it resumed from a snapshot of this "
                f"lineage) and may not write it any more: it would undo the newer job's batches. Fix: "
                f"cancel this job, job {owner_job} carries the lineage on; to go back to an older "
                f"state, submit a new job from that savepoint (`headrace run PIPELINE -s PATH`). "
                f"Nothing was written or deleted; a restart cannot help, every retry is refused the "
                f"same way."
            )
            return
        if owner_job == UNKNOWN:
            whose, resume = "of an unknown lineage (written before Headrace recorded sink owners)", ""
        else:
            whose = f"of lineage {owner_lineage} (job {owner_job})"
            resume = (
                f"resubmit it from a savepoint or retained checkpoint of job {owner_job} "
                f"(`headrace checkpoints {owner_job}`, then `headrace run PIPELINE -s PATH`) to "
                f"continue that lineage, or "
            )
        super().__init__(
            f"{kind} {target} is the sink {whose}; {claimant} may not write it: it would undo or "
            f"mix with that lineage's committed output. Fix: write this job to another {kind}, or "
            f"{resume}release the target if its output may go: {release}. Nothing was written or "
            f"deleted; a restart cannot help, every retry is refused the same way."
        )

    def __reduce__(self):  # picklable despite its own signature (e.g. across processes)
        return (
            SinkOwnedError,
            (self.kind, self.target, self.owner_lineage, self.owner_job, self.claimant, self.release, self.replaced),
        )


def describe(owner: SinkOwner | None) -> str:
    if owner is None:
        return "a batch write"
    return f"job {owner.job_id} (lineage {owner.lineage})"


def check_claim(
    kind: str,
    target: str,
    claimant: SinkOwner,
    current: SinkOwner | None,
    *,
    restored_batch_id: int,
    has_commits: bool,
    release: str,
    replaced: Sequence[str] = (),
) -> None:
    """Raise SinkOwnedError unless `claimant` may prepare a target owned by `current` (None:
    no owner recorded; `replaced`: the owner record's replaced job ids). See the module
    docstring for the rules."""
    if current is not None:
        if current.lineage != claimant.lineage:
            raise SinkOwnedError(kind, target, current.lineage, current.job_id, describe(claimant), release)
        if claimant.job_id != current.job_id and claimant.job_id in replaced:
            raise SinkOwnedError(
                kind, target, current.lineage, current.job_id, describe(claimant), release, replaced=True
            )
        return
    if has_commits and restored_batch_id < 0:
        raise SinkOwnedError(kind, target, UNKNOWN, UNKNOWN, describe(claimant), release)


def replaced_after(claimant: SinkOwner, current: SinkOwner | None, replaced: Sequence[str]) -> list[str]:
    """The replaced job ids to record once `claimant` took the target from `current`."""
    if current is None or current.job_id == claimant.job_id:
        return list(replaced)
    return [j for j in replaced if j != current.job_id][-(MAX_REPLACED - 1) :] + [current.job_id]
