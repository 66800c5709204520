"""Where the JobManager keeps checkpoint *metadata*: the id counter of each job and the pointers
to its completed checkpoints (Flink's CheckpointIDCounter + CompletedCheckpointStore).

- Standalone: the catalog is the store (a counter row per job, and the COMPLETED rows of the
  `checkpoints` table), changed in the unit of work's own transaction.
- ZooKeeper mode: the counter and the pointers in ZooKeeper, as in Flink
  (`shared.zookeeper.ZooKeeperCheckpointStore`), following the catalog: the pointers are written
  after the unit of work committed (a rolled-back completion leaves none) and a new leader sets
  them right from the catalog's COMPLETED rows. Ids never go below the catalog's highest id of
  the job, so a ZooKeeper that lost its data cannot make an id be reused.

The data of a checkpoint is never here: it lives in checkpoint storage (`shared.checkpoint_storage`).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable, Protocol

from sqlalchemy.orm import Session

from shared.catalog import repository as repo
from shared.ids import JobId
from shared.states import CheckpointStatus

log = logging.getLogger("headrace.jobmanager.checkpoints")


class CheckpointStore(Protocol):
    """`next_id` and `latest` run inside the unit of work's transaction. The pointer writes
    (`add`, `remove`, `remove_job`, `reconcile`) run only after it committed (BatchLatest defers
    them), so a rolled-back unit leaves no pointer behind; they get no session then and must be
    idempotent."""

    def next_id(self, s: Session, job_id: JobId) -> int: ...

    def add(self, s: Session | None, job_id: JobId, checkpoint_id: int, pointer: dict) -> None: ...

    def latest(self, s: Session, job_id: JobId) -> dict | None: ...

    def remove(self, s: Session | None, job_id: JobId, checkpoint_id: int) -> None: ...

    def remove_job(self, s: Session | None, job_id: JobId) -> None: ...


def _catalog_latest(s: Session, job_id: JobId) -> dict | None:
    rows = repo.list_checkpoints(s, job_id, statuses=[CheckpointStatus.COMPLETED], limit=1)
    if not rows:
        return None
    r = rows[0]
    return {"id": r.checkpoint_id, "path": r.path, "kind": r.kind, "batch_id": r.batch_id}


def catalog_pointers(s: Session, job_ids: list[JobId]) -> dict[JobId, list[dict]]:
    """The completed checkpoints of those jobs that have any, by the catalog, oldest first: what
    their pointers must be."""
    out: dict[JobId, list[dict]] = {}
    for r in repo.completed_checkpoints_of(s, job_ids):
        out.setdefault(r.job_id, []).append(
            {
                "id": r.checkpoint_id,
                "path": r.path,
                "kind": r.kind,
                "batch_id": r.batch_id,
                "at": r.ack_at.timestamp() if r.ack_at else None,
            }
        )
    for pointers in out.values():
        pointers.sort(key=lambda p: p["id"])
    return out


def _catalog_max_id(s: Session, job_id: JobId) -> int:
    return repo.max_checkpoint_id(s, job_id)


def _catalog_latest_many(s: Session, job_ids: list[JobId]) -> dict[JobId, dict | None]:
    out: dict[JobId, dict | None] = dict.fromkeys(job_ids)
    for r in repo.completed_pointer_rows(s, job_ids):
        best = out[r.job_id]
        if best is None or r.checkpoint_id > best["id"]:
            out[r.job_id] = {"id": r.checkpoint_id, "path": r.path, "kind": r.kind, "batch_id": r.batch_id}
    return out


class BatchLatest:
    """Any store, as the unit of work sees it. The latest pointer of a batch's jobs is read in one
    go (`prefetch`) instead of one query per deployed attempt: 2,000 deploys were 2,000 queries,
    each flushing the batch's pending writes. A pointer added or removed later in the same batch
    drops the job's prefetched answer, so a restart never restores from a superseded checkpoint.
    Pointer writes go to the store through `after_commit` (see CheckpointStore)."""

    def __init__(self, store: CheckpointStore, after_commit: Callable[[Callable[[], None]], None] | None = None):
        self.inner = store
        self._latest: dict[JobId, dict | None] = {}
        self._after_commit = after_commit or (lambda action: action())

    def prefetch(self, s: Session, job_ids: list[JobId]) -> None:
        latest_many = getattr(self.inner, "latest_many", None)
        self._latest = latest_many(s, job_ids) if latest_many is not None and job_ids else {}

    def clear(self) -> None:
        self._latest = {}

    def next_id(self, s: Session, job_id: JobId) -> int:
        return self.inner.next_id(s, job_id)

    def add(self, s: Session | None, job_id: JobId, checkpoint_id: int, pointer: dict) -> None:
        self._latest.pop(job_id, None)
        self._after_commit(lambda: self.inner.add(None, job_id, checkpoint_id, pointer))

    def latest(self, s: Session, job_id: JobId) -> dict | None:
        if job_id in self._latest:
            return self._latest[job_id]
        return self.inner.latest(s, job_id)

    def remove(self, s: Session | None, job_id: JobId, checkpoint_id: int) -> None:
        self._latest.pop(job_id, None)
        self._after_commit(lambda: self.inner.remove(None, job_id, checkpoint_id))

    def remove_job(self, s: Session | None, job_id: JobId) -> None:
        self._latest.pop(job_id, None)
        self._after_commit(lambda: self.inner.remove_job(None, job_id))

    def reconcile(self, s: Session, job_ids: list[JobId]) -> None:
        """A new leader's pointers follow the catalog: a completion its predecessor committed but
        could not point to, or a pointer whose unit of work rolled back, is set right."""
        reconcile = getattr(self.inner, "reconcile", None)
        if reconcile is None or not job_ids:
            return
        wanted = catalog_pointers(s, job_ids)
        if wanted:
            self._after_commit(lambda: reconcile(wanted))


class CatalogCheckpointStore:
    """Standalone mode: everything in the catalog, in the caller's transaction."""

    def next_id(self, s: Session, job_id: JobId) -> int:
        value = repo.next_value(s, f"checkpoint:{job_id}")
        floor = _catalog_max_id(s, job_id)
        while value <= floor:  # counter row lost or behind (e.g. a restored catalog)
            value = repo.next_value(s, f"checkpoint:{job_id}")
        return value

    def add(self, s: Session | None, job_id: JobId, checkpoint_id: int, pointer: dict) -> None:
        pass  # the COMPLETED row written by the same transaction is the pointer

    def latest(self, s: Session, job_id: JobId) -> dict | None:
        return _catalog_latest(s, job_id)

    def latest_many(self, s: Session, job_ids: list[JobId]) -> dict[JobId, dict | None]:
        return _catalog_latest_many(s, job_ids)

    def remove(self, s: Session | None, job_id: JobId, checkpoint_id: int) -> None:
        pass

    def remove_job(self, s: Session | None, job_id: JobId) -> None:
        pass


class ZooKeeperStore:
    """ZooKeeper mode: the id counter and the pointers in ZooKeeper (shared.zookeeper
    .ZooKeeperCheckpointStore), as Flink keeps them. The catalog stays the source of truth: the
    JobManager reads the latest checkpoint from it, in its own transaction, and the pointers
    follow it after each commit. A pointer write that fails is retried before the next one and
    set right by the next leader's `reconcile`."""

    def __init__(self, zk_store: Any):
        self.zk = zk_store
        self._retry: list[Callable[[], None]] = []

    def next_id(self, s: Session, job_id: JobId) -> int:
        # Inside the transaction: an id taken by a unit that rolls back is skipped, never reused.
        return self.zk.next_id(job_id, floor=_catalog_max_id(s, job_id))

    def latest(self, s: Session, job_id: JobId) -> dict | None:
        return _catalog_latest(s, job_id)

    def latest_many(self, s: Session, job_ids: list[JobId]) -> dict[JobId, dict | None]:
        return _catalog_latest_many(s, job_ids)

    def add(self, s: Session | None, job_id: JobId, checkpoint_id: int, pointer: dict) -> None:
        self._write(lambda: self.zk.add(job_id, checkpoint_id, pointer))

    def remove(self, s: Session | None, job_id: JobId, checkpoint_id: int) -> None:
        self._write(lambda: self.zk.remove(job_id, checkpoint_id))

    def remove_job(self, s: Session | None, job_id: JobId) -> None:
        self._write(lambda: self.zk.remove_job(job_id))

    def reconcile(self, wanted: dict[JobId, list[dict]]) -> None:
        """Make each job's pointers exactly the catalog's completed checkpoints."""
        for job_id, pointers in wanted.items():
            self._write(partial(self._sync, job_id, pointers))

    def _sync(self, job_id: JobId, pointers: list[dict]) -> None:
        have = {int(p["id"]) for p in self.zk.completed(job_id)}
        want = {int(p["id"]): p for p in pointers}
        for cid in sorted(have - set(want)):
            self.zk.remove(job_id, cid)
        for cid in sorted(set(want) - have):
            self.zk.add(job_id, cid, {k: v for k, v in want[cid].items() if k != "id"})

    def _write(self, action: Callable[[], None]) -> None:
        """In order, after whatever failed before; a failure keeps the rest for the next write."""
        self._retry.append(action)
        while self._retry:
            try:
                self._retry[0]()
            except Exception:  # ZooKeeper unreachable: the catalog already holds the truth
                log.warning(
                    "checkpoint pointer write to ZooKeeper failed; %d write(s) retried with the next one",
                    len(self._retry),
                    exc_info=True,
                )
                return
            self._retry.pop(0)
