"""Where the JobManager keeps checkpoint *metadata*: the id counter of each job and the pointers
to its completed checkpoints (Flink's CheckpointIDCounter + CompletedCheckpointStore).

- Standalone: the catalog is the store (a counter row per job, and the COMPLETED rows of the
  `checkpoints` table), changed in the unit of work's own transaction.
- ZooKeeper mode: ZooKeeper is the store, as in Flink (`shared.zookeeper.ZooKeeperCheckpointStore`);
  the catalog rows stay the history the REST API shows. Ids never go below the catalog's highest
  id of the job, so a ZooKeeper that lost its data cannot make an id be reused.

The data of a checkpoint is never here: it lives in checkpoint storage (`shared.checkpoint_storage`).
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shared.catalog import repository as repo
from shared.catalog.models import CheckpointRow
from shared.states import CheckpointStatus


class CheckpointStore(Protocol):
    def next_id(self, s: Session, job_id: str) -> int: ...

    def add(self, s: Session, job_id: str, checkpoint_id: int, pointer: dict) -> None: ...

    def latest(self, s: Session, job_id: str) -> dict | None: ...

    def remove(self, s: Session, job_id: str, checkpoint_id: int) -> None: ...

    def remove_job(self, s: Session, job_id: str) -> None: ...


def _catalog_latest(s: Session, job_id: str) -> dict | None:
    rows = repo.list_checkpoints(s, job_id, statuses=[CheckpointStatus.COMPLETED], limit=1)
    if not rows:
        return None
    r = rows[0]
    return {"id": r.checkpoint_id, "path": r.path, "kind": r.kind, "batch_id": r.batch_id}


def _catalog_max_id(s: Session, job_id: str) -> int:
    return s.execute(select(func.max(CheckpointRow.checkpoint_id)).where(CheckpointRow.job_id == job_id)
                     ).scalar() or 0


def _catalog_latest_many(s: Session, job_ids: list[str]) -> dict[str, dict | None]:
    out: dict[str, dict | None] = dict.fromkeys(job_ids)
    for i in range(0, len(job_ids), 1000):
        rows = s.execute(select(CheckpointRow.job_id, CheckpointRow.checkpoint_id, CheckpointRow.path,
                                CheckpointRow.kind, CheckpointRow.batch_id)
                         .where(CheckpointRow.job_id.in_(job_ids[i:i + 1000]),
                                CheckpointRow.status == CheckpointStatus.COMPLETED.value)).all()
        for r in rows:
            best = out[r.job_id]
            if best is None or r.checkpoint_id > best["id"]:
                out[r.job_id] = {"id": r.checkpoint_id, "path": r.path, "kind": r.kind, "batch_id": r.batch_id}
    return out


class BatchLatest:
    """Any store, with the latest pointer of a batch's jobs read in one go (`prefetch`) instead
    of one query per deployed attempt: 2,000 deploys were 2,000 queries, each flushing the
    batch's pending writes. A pointer added or removed later in the same batch drops the job's
    prefetched answer, so a restart never restores from a superseded checkpoint."""

    def __init__(self, store: CheckpointStore):
        self.inner = store
        self._latest: dict[str, dict | None] = {}

    def prefetch(self, s: Session, job_ids: list[str]) -> None:
        latest_many = getattr(self.inner, "latest_many", None)
        self._latest = latest_many(s, job_ids) if latest_many is not None and job_ids else {}

    def clear(self) -> None:
        self._latest = {}

    def next_id(self, s: Session, job_id: str) -> int:
        return self.inner.next_id(s, job_id)

    def add(self, s: Session, job_id: str, checkpoint_id: int, pointer: dict) -> None:
        self._latest.pop(job_id, None)
        self.inner.add(s, job_id, checkpoint_id, pointer)

    def latest(self, s: Session, job_id: str) -> dict | None:
        if job_id in self._latest:
            return self._latest[job_id]
        return self.inner.latest(s, job_id)

    def remove(self, s: Session, job_id: str, checkpoint_id: int) -> None:
        self._latest.pop(job_id, None)
        self.inner.remove(s, job_id, checkpoint_id)

    def remove_job(self, s: Session, job_id: str) -> None:
        self._latest.pop(job_id, None)
        self.inner.remove_job(s, job_id)


class CatalogCheckpointStore:
    """Standalone mode: everything in the catalog, in the caller's transaction."""

    def next_id(self, s: Session, job_id: str) -> int:
        value = repo.next_value(s, f"checkpoint:{job_id}")
        floor = _catalog_max_id(s, job_id)
        while value <= floor:  # counter row lost or behind (e.g. a restored catalog)
            value = repo.next_value(s, f"checkpoint:{job_id}")
        return value

    def add(self, s: Session, job_id: str, checkpoint_id: int, pointer: dict) -> None:
        pass  # the COMPLETED row written by the same transaction is the pointer

    def latest(self, s: Session, job_id: str) -> dict | None:
        return _catalog_latest(s, job_id)

    def latest_many(self, s: Session, job_ids: list[str]) -> dict[str, dict | None]:
        return _catalog_latest_many(s, job_ids)

    def remove(self, s: Session, job_id: str, checkpoint_id: int) -> None:
        pass

    def remove_job(self, s: Session, job_id: str) -> None:
        pass


class ZooKeeperStore:
    """ZooKeeper mode: ids and pointers in ZooKeeper (see shared.zookeeper.ZooKeeperCheckpointStore)."""

    def __init__(self, zk_store):
        self.zk = zk_store

    def next_id(self, s: Session, job_id: str) -> int:
        return self.zk.next_id(job_id, floor=_catalog_max_id(s, job_id))

    def add(self, s: Session, job_id: str, checkpoint_id: int, pointer: dict) -> None:
        self.zk.add(job_id, checkpoint_id, pointer)

    def latest(self, s: Session, job_id: str) -> dict | None:
        pointers = self.zk.completed(job_id)
        if pointers:
            return pointers[-1]
        # A job that started before ZooKeeper mode was switched on (or whose pointers ZooKeeper
        # lost) still has its completed checkpoints in the catalog: never restart from nothing.
        return _catalog_latest(s, job_id)

    def remove(self, s: Session, job_id: str, checkpoint_id: int) -> None:
        self.zk.remove(job_id, checkpoint_id)

    def remove_job(self, s: Session, job_id: str) -> None:
        self.zk.remove_job(job_id)
